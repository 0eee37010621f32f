"""What a payload, an error text, a fingerprint or a stored record looks like to the person reading it.

Viewers see payloads with the keys named in `web.redact_keys` (any depth, case-insensitive)
replaced by "[redacted]"; operators and admins see them whole. Then, for everyone, the
deployer's hook (`web.redact_hook = "module:function"`, called as `hook(payload, user)`) may
change or mask anything else.

Error text (a job's `last_error`, its error history's messages and tracebacks, the timeline
built from them, error groups' examples, a bulk operation's error) is as sensitive as the
payload that caused it: `text_for(text, user)` masks, for viewers, the value written after a
redacted key (`card_number=4111...`, `"password": "..."`, `token: abc`), then, for everyone,
the text hook (`web.redact_text_hook = "module:function"`, called as `hook(text, user)`,
returning the text to show) masks whatever else the deployment knows to be secret (card
numbers without a key, e-mail addresses...). It is a second setting, not a new argument of
`redact_hook`, so existing payload hooks keep working unchanged.

A job's per-attempt log records (`attempt_logs_for`) are error text too: the worker stores
them redacted with its keys, and viewers see them redacted again with web.redact_keys.

Derived values are redacted like what they derive from (issue 26; docs/security.md lists
them): an error fingerprint (`fingerprint_for`, and a viewer may not filter on a fingerprint
that shows a redacted value: `may_filter_on_fingerprint`), stored records that quote payloads
or errors (`record_for`: audit selections and details, bulk operations' selections, periodic
schedules' payloads), group labels and search matches (through `text_for`).

Shape: every walk is bounded and iterative (console.jsonbounds): a payload nested 500 levels
deep or holding 100,000 keys is shown within `bounds` (`PAGE` for HTML, `WHOLE` for the API
and exports: depth capped, width whole), never by recursion.

Selections (the audit log's `selection`, a bulk operation's) may carry a payload filter:
viewers may not filter on a redacted key at all (`may_filter_on`): a containment filter would
tell them the value by its answer.

Pages, exports and the JSON API all go through these functions.
"""

from __future__ import annotations

from typing import Any

from console.jsonbounds import PAGE, WHOLE, Bounds, bounded, keys_in
from console.redaction import DEFAULT_KEYS, REDACTED, redact_text
from console.users import User

__all__ = ["PAGE", "REDACTED", "WHOLE", "attempt_logs_for", "audit_row_for", "error_entry_for", "fingerprint_for", "fingerprint_hidden", "group_for", "may_filter_on",
           "may_filter_on_fingerprint", "notification_keys", "payload_for", "record_for", "selection_for", "text_for"]


def _sees_all(user: User | None) -> bool:
    return user is not None and user.can("operator")


def _state():
    from console.web import state

    return state()


def payload_for(payload: Any, user: User | None, bounds: Bounds = WHOLE) -> Any:
    """A payload as `user` may see it, within `bounds`: viewers without the redacted keys'
    values (any depth), then the deployer's payload hook for everyone."""
    st = _state()
    if _sees_all(user):
        payload = bounded(payload, bounds)
    else:
        payload = bounded(payload, bounds, hide_keys=st.redact_keys, hidden=REDACTED)
    if st.redact_hook is not None:
        payload = st.redact_hook(payload, user)
    return payload


def text_for(text: Any, user: User | None) -> Any:
    """Error text as `user` may see it (None and non-strings pass through)."""
    if not isinstance(text, str) or not text:
        return text
    st = _state()
    if not _sees_all(user):
        text = redact_text(text, st.redact_keys)
    if st.redact_text_hook is not None:
        text = st.redact_text_hook(text, user)
    return text


def fingerprint_for(fingerprint: Any, user: User | None) -> Any:
    """An error fingerprint as `user` may see it. It is derived from the error text, so viewers
    see it redacted like the text (the keys' values, then the text hook). Fingerprints made
    since issue 26 hide secrets already (`<redacted>`, console.fingerprint); this covers older
    rows and keys configured only in web.redact_keys. Operators get it as stored: it is the
    identifier they replay and purge a group by."""
    if _sees_all(user):
        return fingerprint
    return text_for(fingerprint, user)


def fingerprint_hidden(fingerprint: Any, user: User | None) -> bool:
    """Whether `user` sees `fingerprint` changed by redaction: a link must not then filter on
    the shown form (it matches nothing), nor on the stored one (it would leak it)."""
    return isinstance(fingerprint, str) and fingerprint_for(fingerprint, user) != fingerprint


def group_for(grp: dict[str, Any], user: User | None) -> dict[str, Any]:
    """An error group (a row of console.maintenance.groups) as `user` may see it: its label
    (the fingerprint) and example redacted like error text; `filterable` is false when the
    label is not the stored fingerprint (a link then cannot filter on it)."""
    fingerprint = grp["fingerprint"]
    return {**grp, "fingerprint": fingerprint_for(fingerprint, user),
            "filterable": fingerprint != "(no fingerprint)" and not fingerprint_hidden(fingerprint, user),
            "example": text_for(grp.get("example"), user)}


def record_for(value: Any, user: User | None, bounds: Bounds = WHOLE) -> Any:
    """A stored record that may quote payloads or error text (an audit row's selection or
    detail, a bulk operation's selection, a periodic schedule's payload): for viewers, the
    redacted keys' values hidden at any depth and every string redacted as error text; for
    everyone, within `bounds`."""
    if _sees_all(user):
        value = bounded(value, bounds)
    else:
        keys = _state().redact_keys
        value = bounded(value, bounds, hide_keys=keys, hidden=REDACTED, text=lambda s: redact_text(s, keys))
    hook = _state().redact_text_hook
    if hook is not None:
        value = bounded(value, WHOLE, text=lambda s: hook(s, user))
    return value


def audit_row_for(row: dict[str, Any], user: User | None) -> dict[str, Any]:
    """An audit row as `user` may see it: its selection and detail quote what was acted on (a
    payload filter, a fingerprint, an operation's error, an enqueued job's fields) and are
    redacted like the values they quote. The operator-written reason is shown as written."""
    return {**row, "selection": record_for(row.get("selection"), user), "detail": record_for(row.get("detail"), user)}


def notification_keys() -> frozenset[str]:
    """The keys whose values an alert's look-here links hide (console.alerts.links): the
    defaults and web.redact_keys, as the scheduler's webhooks do, so page and webhook agree."""
    return DEFAULT_KEYS | _state().redact_keys


def selection_for(selection: Any, user: User | None) -> Any:
    """A stored selection (audit log, bulk operation): its payload filter shown as a payload,
    its fingerprint and every other value as error text (`record_for`)."""
    return record_for(selection, user)


def error_entry_for(entry: dict[str, Any], user: User | None) -> dict[str, Any]:
    """One entry of a job's error history, its message, traceback and fingerprint redacted."""
    texts = ("message", "traceback", "reason", "fingerprint")
    return {**entry, **{k: text_for(entry.get(k), user) for k in texts if k in entry}}


def attempt_logs_for(entries: Any, user: User | None, bounds: Bounds = WHOLE) -> list[dict[str, Any]]:
    """A job's per-attempt log records (`attempt_logs`) as `user` may see them. The worker
    stored them redacted already, with its own keys (console.queue.joblogs); a viewer sees
    them redacted again with web.redact_keys like any stored record (`record_for`: the keys'
    values in `extra`, and every message, traceback and string of `extra` as error text), and
    the text hook applies for everyone. Anything that is not an entry is left out."""
    if not isinstance(entries, list):
        return []
    kept = [e for e in entries if isinstance(e, dict)]
    shown = record_for(kept, user, bounds)
    return [e for e in shown if isinstance(e, dict)] if isinstance(shown, list) else []


def may_filter_on(payload_filter: dict[str, Any] | None, user: User | None) -> str | None:
    """A viewer may not probe redacted values with a containment filter: the complaint, or None.
    Refused: a redacted key at any depth, or a string value that names one (`"token=abc"`),
    whose value the viewer would see as [redacted]."""
    if payload_filter is None or _sees_all(user):
        return None
    keys = _state().redact_keys
    hidden = sorted(set(keys_in(payload_filter)) & keys)
    if hidden:
        return f"payload filter: viewers cannot filter on redacted keys ({', '.join(hidden)})"
    if any(redact_text(s, keys) != s for s in _strings_in(payload_filter)):
        return "payload filter: viewers cannot filter on a value written after a redacted key"
    return None


def may_filter_on_fingerprint(fingerprint: str | None, user: User | None) -> str | None:
    """A viewer may not probe a fingerprint's redacted value (`ValueError: token=guess` matching
    or not would tell the value): the complaint, or None."""
    if not fingerprint or _sees_all(user):
        return None
    if redact_text(fingerprint, _state().redact_keys) != fingerprint:
        return "fingerprint: viewers cannot filter on a value written after a redacted key"
    return None


def _strings_in(value: Any) -> list[str]:
    found: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return found
