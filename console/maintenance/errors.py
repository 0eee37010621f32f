"""What maintenance refuses, as ValueError subclasses the faces turn into a message.

The CLI shows them as usage errors (exit 2), the web as HTTP 400 (409 for `OperationState` and
`PreviewMismatch`).
Nothing has been changed in the database when one of these is raised.
"""

from __future__ import annotations


class MaintenanceError(ValueError):
    """Bad input to a maintenance function; the message names the problem."""


class InvalidSelection(MaintenanceError):
    """A dead-letter selection that is malformed (unknown key, bad date, impossible range...)."""


class NothingMatches(MaintenanceError):
    """The selection is valid but matches no dead letter: there is nothing to replay or purge."""


class InvalidSettings(MaintenanceError):
    """A batch size, rate or age out of range."""


class OperationState(MaintenanceError):
    """The bulk operation does not exist or is not in a state that allows the request."""


class PreviewMismatch(MaintenanceError):
    """A bulk start whose selection no longer matches exactly what the operator previewed (more,
    fewer or other jobs, or another selection): preview again. HTTP 409."""


class UnknownQueue(MaintenanceError):
    """No queue has that name: no jobs, no samples, no limits, never paused (a typo, most
    likely; the message suggests the nearest known names). HTTP 404; CLI exit 2."""
