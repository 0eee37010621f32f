"""Which operator actions need a reason, from every face, and who the actor is.

`ACTIONS` is the one table: each operator action, the audit action name(s) it writes, whether
a reason is required, the faces that offer it (cli, ui, api), and why. The faces check against
it with `require_reason(action, reason)` before changing anything:

    reason = require_reason("pause", request.form.get("reason"))   # ReasonRequired if missing

`ReasonRequired` is a ValueError: the web maps it to 422 (API and pages alike), the CLI to exit
code 2 naming `--reason` (after prompting when stdin is a terminal). docs/maintenance.md's table
"Which actions need a reason" is `markdown_table()`; tests/test_action_reasons.py checks they
match and drives every (action, face) pair of the table.

The rule (issue 18): bulk and destructive actions, and changes to who may act or who is told,
need a reason, because an incident review reads the audit log and an entry without a why is
a question nobody can answer later. One-job replays, retries and acknowledgements stay one
click: the job's own error (or the alert) is the context, and they are easy to undo.

Actors (`cli_actor()` here; the web's is console.web.actor): a console user's name, an API
token's owner and label ("alice (token deploy-bot)"), or `cli:<os user>@<host>`; an
automation's `--actor NAME` is recorded as given, beside the OS user: "NAME (cli:root@host)".

This module does not touch the database or know about HTTP or click.
"""

from __future__ import annotations

import getpass
import re
import socket
import unicodedata
from dataclasses import dataclass

FACES = ("cli", "ui", "api")
MAX_REASON = 500
MAX_ACTOR = 100
_ACTOR = re.compile(r"^[^\x00-\x1f\x7f()]{1,100}$")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # PostgreSQL text refuses NUL; the rest confuse a log


@dataclass(frozen=True)
class Requirement:
    """One operator action: what it is called in the audit log, whether it needs a reason,
    which faces offer it, and why (shown in docs/maintenance.md)."""

    audit: tuple[str, ...]
    reason: bool
    faces: tuple[str, ...]
    what: str
    why: str


def _r(audit: str | tuple[str, ...], reason: bool, faces: str, what: str, why: str) -> Requirement:
    return Requirement(audit if isinstance(audit, tuple) else (audit,), reason, tuple(faces.split()), what, why)


ACTIONS: dict[str, Requirement] = {
    "replay_many": _r("replay", True, "cli ui api", "Replay dead letters matching a filter or several ids",
                      "Puts many jobs back to work at once; the review needs to know what was fixed first."),
    "replay_one": _r("replay", False, "cli ui api", "Replay one dead letter (by its id)",
                     "One job, and its own error is the context; a retry at 3 a.m. stays one click."),
    "edit_replay": _r("edit_replay", True, "cli ui api", "Fix and replay one dead letter (edit its payload, priority, queue or run-at)",
                      "Changes what a job does before it runs again; the review needs to know why the data was wrong."),
    "run_now": _r("run_now", False, "ui api", "Run one pending job now",
                  "One job, moved earlier; nothing is lost."),
    "cancel_job": _r("cancel", False, "ui api", "Cancel one pending job",
                     "One job; the reason, if given, is also written into the job's error."),
    "request_cancel": _r("request_cancel", False, "ui api", "Ask one running job to stop",
                         "One job, and its handler decides; the reason, if given, is kept with the request."),
    "purge": _r("purge", True, "cli ui api", "Purge dead letters (one or many)",
                "Destroys jobs (or moves them out of reach): it cannot be undone."),
    "operation_cancel": _r("cancel", False, "cli ui api", "Cancel a running bulk replay or purge",
                           "Stops an action that was itself audited with a reason."),
    "error_group_ignore": _r("error_group_ignore", True, "cli ui api", "Ignore an error group (it never alerts)",
                             "Nobody hears of that failure again, however often it comes back."),
    "error_group_unignore": _r("error_group_unignore", True, "cli ui api", "Stop ignoring an error group",
                               "Someone chose silence on purpose; say what changed."),
    "pause": _r("pause", True, "cli ui api", "Pause a queue",
                "Stops a whole queue's work; whoever finds it paused must learn why."),
    "resume": _r("resume", True, "cli ui api", "Resume a paused queue",
                 "Restarts a queue someone stopped on purpose; say what changed."),
    "archive": _r("archive", True, "cli ui api", "Archive (or delete) completed jobs by hand",
                  "Moves or deletes many rows outside the schedule; the scheduler's own runs need none."),
    "retention": _r("retention", True, "cli", "Apply archive retention by hand",
                    "Deletes archived jobs for good."),
    "reap": _r("reap", False, "cli ui api", "Reap expired leases now",
               "The same rescue the scheduler runs every minute, only sooner."),
    "limit_change": _r(("set limits", "clear limits"), True, "cli ui api", "Change a queue's concurrency or rate limits",
                       "Changes how fast a queue may run for everyone, across the fleet."),
    "queue_backend": _r("set backend", True, "cli", "Route a queue's new jobs to PostgreSQL or to a broker (NATS)",
                        "Changes where every producer's jobs of the queue go and which workers run them."),
    "queue_move": _r("move queue", True, "cli ui api", "Move a queue to PostgreSQL or to a broker (NATS), with a dual-run window",
                     "Changes where every producer's jobs of the queue go; the review needs to know why, and what "
                     "the old side still held."),
    "alert_silence": _r("alert_silence", True, "cli ui api", "Silence alerts",
                        "Nobody is told while it lasts."),
    "alert_acknowledge": _r("alert_acknowledge", False, "cli ui api", "Acknowledge an alert (the note is the reason)",
                            "Says who is on it; it silences nothing beyond repeats."),
    "alert_rule_save": _r("alert_rule_save", True, "ui api", "Create or change an alert rule",
                          "Changes what wakes someone up."),
    "alert_rule_delete": _r("alert_rule_delete", True, "ui api", "Delete an alert rule",
                            "Stops an alert for good."),
    "alert_destination_save": _r("alert_destination_save", True, "ui api", "Create or change a webhook destination",
                                 "Changes who is told."),
    "alert_destination_delete": _r("alert_destination_delete", True, "ui", "Delete a webhook destination",
                                   "Stops telling someone."),
    "user_add": _r(("user_add", "user_update"), True, "cli ui", "Add a user, or change a user's role or password",
                   "Changes who may act."),
    "user_disable": _r("user_disable", True, "cli ui", "Disable a user",
                       "Locks someone out (their tokens too)."),
    "user_enable": _r("user_enable", True, "cli ui", "Enable a user",
                      "Lets someone back in."),
    "token_create": _r("token_create", True, "cli ui", "Create an API token",
                       "A new credential that acts as its owner."),
    "token_revoke": _r("token_revoke", True, "cli ui", "Revoke an API token",
                       "Breaks whatever script used it."),
    "operation_resume": _r("resume_operation", True, "ui api", "Resume a cancelled or failed bulk operation",
                           "Restarts a bulk change someone stopped, maybe on purpose; say why it is safe now."),
    "sessions_revoke": _r("sessions_revoke", True, "cli", "End a user's web sessions",
                          "Signs someone out everywhere; the review needs to know whether it answered a stolen cookie."),
    "backend_cancel": _r("backend_cancel", True, "cli ui api",
                         "Cancel the running query of a horizon holder or a lock blocker (pg_cancel_backend)",
                         "Aborts someone else's work in the database; the review must know whose, why, and what it cost."),
    "backend_terminate": _r("backend_terminate", True, "cli ui api",
                            "Terminate the session of a horizon holder or a lock blocker (pg_terminate_backend)",
                            "Ends someone else's session and rolls back its transaction: it cannot be undone."),
}


class ReasonRequired(ValueError):
    """The action needs a reason and none was given, or the one given says nothing (HTTP 422,
    CLI exit 2). `given`: a reason was sent but it is too short to say anything."""

    def __init__(self, action: str, message: str | None = None, *, given: bool = False):
        self.action = action
        self.given = given
        req = ACTIONS[action]
        super().__init__(message or f"reason: required to {req.what[0].lower()}{req.what[1:]} (it goes in the "
                         "audit log); say why, e.g. 'SMTP password fixed in deploy 412'")


class ReasonSaysNothing(ValueError):
    """A reason with fewer than MIN_VISIBLE visible characters (HTTP 400 where no action is named)."""


# --- what a reason must be --------------------------------------------------------------------
#
# One rule, every face (web form, API, CLI, Python through console.audit.record): a reason
# says something in at least MIN_VISIBLE visible characters: letters, digits, punctuation or
# symbols (Unicode categories L, N, P, S). Space and format characters (zero-width space, ZWJ,
# ZWNJ, BOM, word joiner, bidi marks: categories Z and Cf) and combining marks on their own are
# not visible, and neither are the few letters and symbols that render as blank space
# (`INVISIBLE`: the Hangul fillers, the braille blank, ...). A reason made only of those is no
# reason (None, so an action that needs one is refused); one with 1 or 2 visible characters is
# refused with a message saying what is missing.

MIN_VISIBLE = 3
# Letters and symbols by category that draw nothing: Hangul choseong/jungseong fillers, Hangul
# filler, halfwidth Hangul filler, braille pattern blank, Khmer inherent vowels, Mongolian
# vowel separator, combining grapheme joiner, musical symbol null notehead... and the
# invisible operators (function application, invisible times/separator/plus).
INVISIBLE = frozenset("\u115f\u1160\u3164\uffa0\u2800\u17b4\u17b5\u180e\u034f\U0001d159"
                      "\u2061\u2062\u2063\u2064")
_VISIBLE_CATEGORIES = ("L", "N", "P", "S")


def is_visible(char: str) -> bool:
    """Whether `char` draws something a reader can see (see the rule above)."""
    return char not in INVISIBLE and unicodedata.category(char)[0] in _VISIBLE_CATEGORIES


def _blank(char: str) -> bool:
    """White space or an invisible character; a combining mark belongs to its letter."""
    return not is_visible(char) and unicodedata.category(char)[0] != "M"


def _strip_blank(text: str) -> str:
    """`text` without white space and invisible characters at either end."""
    start, end = 0, len(text)
    while start < end and _blank(text[start]):
        start += 1
    while end > start and _blank(text[end - 1]):
        end -= 1
    return text[start:end]


def clean_reason(reason: object) -> str | None:
    """The reason as recorded: without blank space (white or invisible) at either end; None
    when nothing visible is left; ReasonSaysNothing (a ValueError) when fewer than MIN_VISIBLE
    visible characters are; ValueError when too long or holding control characters."""
    text = _strip_blank(str(reason)) if reason is not None else ""
    if len(text) > MAX_REASON:
        raise ValueError(f"reason: at most {MAX_REASON} characters (got {len(text)})")
    if _CONTROL.search(text):
        raise ValueError("reason: control characters are not allowed (line breaks and tabs are)")
    visible = sum(1 for char in text if is_visible(char))
    if visible == 0:
        return None
    if visible < MIN_VISIBLE:
        raise ReasonSaysNothing(f"reason: say why in at least {MIN_VISIBLE} visible characters (letters, digits, "
                                f"punctuation or symbols; got {visible}), e.g. 'SMTP password fixed in deploy 412'")
    return text


def require_reason(action: str, reason: object) -> str | None:
    """The cleaned reason; ReasonRequired when `action` needs one and it is empty or says
    nothing visible, or when the one given is too short to say anything."""
    if action not in ACTIONS:
        raise KeyError(f"{action!r} is not in console.actions.ACTIONS")
    try:
        text = clean_reason(reason)
    except ReasonSaysNothing as exc:
        raise ReasonRequired(action, str(exc), given=True) from None
    if text is None and ACTIONS[action].reason:
        raise ReasonRequired(action)
    return text


def bulk_action(action: str, selection: dict | None) -> str:
    """The table's name for a dead-letter replay or purge of `selection` (a Selection's dict):
    a replay naming exactly one id and nothing else is `replay_one`, any other replay
    `replay_many` (a filter may match more tomorrow than today); every purge is `purge`."""
    if action == "purge":
        return "purge"
    given = {k: v for k, v in (selection or {}).items() if v not in (None, [], False)}
    if set(given) == {"ids"} and len(given["ids"]) == 1:
        return "replay_one"
    return "replay_many"


def os_identity() -> str:
    """`cli:<os user>@<host>`: the login name from the environment or the password database,
    and the host name (a container without either still says which machine)."""
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no LOGNAME/USER and no passwd entry for the uid
        import os

        user = f"uid{os.getuid()}"
    host = socket.gethostname() or "localhost"
    return f"cli:{user}@{host}"


def cli_actor(override: str | None = None) -> str:
    """The CLI's actor: `cli:<os user>@<host>`, or `NAME (cli:<os user>@<host>)` with --actor NAME."""
    me = os_identity()
    if override is None:
        return me
    name = override.strip()
    if not _ACTOR.match(name):
        raise ValueError(f"--actor: {override!r} must be 1-{MAX_ACTOR} characters without control characters or parentheses")
    return f"{name} ({me})"


def markdown_table() -> str:
    """docs/maintenance.md's table, generated from ACTIONS (a test keeps the page in step)."""
    lines = ["| Action | Audit log `action` | Reason | Faces | Why |", "|---|---|---|---|---|"]
    for key, req in ACTIONS.items():
        faces = ", ".join(req.faces) or "none yet"
        audit = ", ".join(f"`{a}`" for a in req.audit)
        lines.append(f"| {req.what} (`{key}`) | {audit} | {'required' if req.reason else 'optional'} | {faces} | {req.why} |")
    return "\n".join(lines)
