"""Webhook signatures checked independently of the product's own code.

docs/alerts.md promises `X-Skiplock-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of
"<t>.<body>">` and tells receivers to refuse timestamps more than five minutes off. A check
written with `console.alerts.transports.verify` cannot notice when `sign` and `verify` drift
together, so here a real notification goes through the outbox to a real local HTTP receiver
and its signature is recomputed with the standard library, from the recipe in the docs, and
with the docs' own snippet. The replay window is checked on the product's `verify` helper
(the one `skiplock alerts receiver` uses).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from console import samples
from console.alerts import evaluate as ev
from console.alerts import outbox
from console.alerts.rules import RuleSet, parse_destination, parse_rule
from console.alerts.transports import verify
from console.samples import Sample
from tests.alert_receiver import Receiver

ROOT = Path(__file__).resolve().parent.parent
SECRET = "whsec-contract-5f1d"
SETTINGS = ev.AlertSettings(repeat_interval=3600, series_window=120, delivery_timeout=2, retry_base=0.05,
                            retry_cap=0.2, give_up_after=3600,
                            allow_private_destinations=True)  # the receiver is on loopback
RULE = {"name": "queue_age", "metric": "queue_age_seconds", "op": ">", "threshold": 100, "for": "0s"}
HEADER = re.compile(r"^t=(\d+),v1=([0-9a-f]{64})$")


def recipe_signature(secret: str, timestamp: int, body: bytes) -> str:
    """docs/alerts.md, written out: HMAC-SHA256 with the shared secret over the timestamp, a dot
    and the raw body bytes, hex encoded."""
    return hmac.new(secret.encode("utf-8"), str(timestamp).encode("ascii") + b"." + body, hashlib.sha256).hexdigest()


def docs_verify():
    """The `verify` function exactly as docs/alerts.md prints it for receivers."""
    text = (ROOT / "docs" / "alerts.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "def verify(" in b]
    assert len(blocks) == 1, "docs/alerts.md should show one verify() recipe"
    namespace: dict = {}
    exec(compile(blocks[0], "docs/alerts.md", "exec"), namespace)  # noqa: S102 - our own docs
    return namespace["verify"]


@pytest.fixture
def delivery(conn):
    """One real firing notification, delivered by the outbox to a real local HTTP receiver."""
    with Receiver() as receiver:
        dest = parse_destination({"name": "hook", "url": receiver.url, "kind": "json", "secret": SECRET})
        rules = RuleSet(rules={"queue_age": parse_rule(RULE)}, destinations={"hook": dest})
        at = datetime.now(UTC)
        samples.store(conn, [Sample("queue_age_seconds", {"queue": "mail"}, 500.0, at)])
        ev.evaluate(conn, rules, SETTINGS, now=at)
        sender = outbox.Sender(conn, lambda: rules.destinations, SETTINGS)
        sent_at = time.time()
        deadline = time.monotonic() + 10
        while not receiver.delivered():
            assert time.monotonic() < deadline, "the outbox did not deliver within 10 s"
            sender.run_once()
            time.sleep(0.05)
    [request] = receiver.requests
    return request, sent_at


def test_a_real_delivery_verifies_with_an_hmac_written_from_the_docs(delivery):
    request, sent_at = delivery
    body, header = request["body"], request["headers"]["X-Skiplock-Signature"]
    match = HEADER.match(header)
    assert match, f"signature header not in the documented form: {header!r}"
    timestamp, digest = int(match[1]), match[2]
    assert abs(timestamp - sent_at) <= 5, "the signature's timestamp is not the time of sending"
    assert hmac.compare_digest(digest, recipe_signature(SECRET, timestamp, body))
    # and not by accident: another secret, another body or another timestamp give another digest
    assert digest != recipe_signature("not-the-secret", timestamp, body)
    assert digest != recipe_signature(SECRET, timestamp, body + b" ")
    assert digest != recipe_signature(SECRET, timestamp + 1, body)


def test_the_docs_own_verify_snippet_accepts_the_real_delivery(delivery):
    request, _ = delivery
    body, header = request["body"], request["headers"]["X-Skiplock-Signature"]
    receiver_verify = docs_verify()
    assert receiver_verify(SECRET, header, body) is True
    assert receiver_verify(SECRET, header, body.replace(b"mail", b"mall")) is False
    assert receiver_verify("not-the-secret", header, body) is False
    stale = f"t={int(time.time()) - 400},v1={recipe_signature(SECRET, int(time.time()) - 400, body)}"
    assert receiver_verify(SECRET, stale, body) is False
    for malformed in ("", "garbage", "t=abc,v1=00", "t=1800000000"):
        assert receiver_verify(SECRET, malformed, body) is False


def signed(timestamp: int, body: bytes) -> str:
    return f"t={timestamp},v1={recipe_signature(SECRET, timestamp, body)}"


BODY = b'{"event":"firing","version":1}'


@pytest.mark.parametrize("offset, accepted", [
    (0, True),
    (-299, True),      # just inside the five minutes
    (299, True),       # a receiver's clock a little behind ours
    (-301, False),     # stale: a replay of an old delivery
    (-86_400, False),
    (301, False),      # from the future: refused too, or a captured request could be replayed later
    (86_400, False),
])
def test_verify_refuses_stale_and_future_timestamps(offset, accepted):
    now = 1_800_000_000.0
    header = signed(int(now) + offset, BODY)
    assert verify(SECRET, header, BODY, now=now) is accepted
    assert verify(SECRET, header, BODY, now=now, tolerance=100_000) is True  # only the window refused it


@pytest.mark.parametrize("header", ["", "garbage", "t=abc,v1=00", "v1=" + "0" * 64, "t=1800000000"])
def test_verify_refuses_malformed_headers_without_raising(header):
    assert verify(SECRET, header, BODY, now=1_800_000_000.0) is False
