"""The demo's job handlers: a small shop's background work, with realistic failures.

Whether a job succeeds is decided by its payload, the way real failures depend on real data,
so the traffic generator controls the mix and a test can predict each outcome:

- `billing.charge_card`: a card ending 0002 is declined -> `DoNotRetry` (dead letter at once).
- `mail.send_receipt`: `"greylisted": true` fails the first attempt (451), then succeeds.
- `webhooks.deliver`: partner-b answers 503 on the first attempt; partner-c is down and refuses
  every attempt, so its jobs exhaust `max_attempts` and become dead letters.
- `reports.build`: a payload without `customer_id` raises KeyError every attempt (a bug).
- `images.thumbnail`, `search.reindex`: always succeed.

Each handler sleeps for `payload["ms"]` milliseconds to stand for I/O: no CPU is burnt. It waits
on the job's cancel event rather than sleeping blind, so the console's "Request cancel" stops a
long one at the worker's next heartbeat: the handler raises `console.Cancelled` and the job
becomes a dead letter with error class Cancelled (replayable), as a real handler should.

The handlers that can fail log what they try, as an application would, so a dead letter's page
shows the records of each attempt (per-attempt logs, docs/queue.md).
"""

from __future__ import annotations

import logging

import console

log = logging.getLogger("shop")


class CardDeclined(console.DoNotRetry):
    """A declined card will not pass on retry: straight to the dead letters."""


class SMTPTemporaryError(Exception):
    pass


class PartnerUnavailable(Exception):
    pass


def _work(job) -> None:
    """Stand for `payload["ms"]` of I/O; stop early when an operator asks this run to stop."""
    payload = job.payload if isinstance(job.payload, dict) else {}
    seconds = max(float(payload.get("ms", 50)), 0.0) / 1000.0
    if job.cancel_event.wait(seconds) and job.cancel_requested():
        raise console.Cancelled(f"job {job.id} ({job.kind}) stopped at the operator's request")


@console.task("billing.charge_card")
def charge_card(job):
    log.info("charging order %s, card ending %s", job.payload.get("order"), job.payload.get("card_last4"))
    _work(job)
    if job.payload.get("card_last4") == "0002":
        log.warning("the issuer declined order %s: not retried", job.payload.get("order"))
        raise CardDeclined(f"card ending 0002 declined for order {job.payload.get('order')}")


@console.task("mail.send_receipt")
def send_receipt(job):
    _work(job)
    if job.payload.get("greylisted") and job.attempt == 1:
        raise SMTPTemporaryError(f"451 4.7.1 {job.payload.get('to', 'recipient')}: greylisted, try again later")


@console.task("webhooks.deliver")
def deliver_webhook(job):
    endpoint = str(job.payload.get("endpoint", ""))
    log.info("POST %s (attempt %d)", endpoint, job.attempt)
    _work(job)
    if "partner-c" in endpoint:
        raise ConnectionRefusedError(f"connection refused by {endpoint.split('/')[2]}:443")
    if "partner-b" in endpoint and job.attempt == 1:
        raise PartnerUnavailable(f"{endpoint} answered 503 Service Unavailable")


@console.task("reports.build")
def build_report(job):
    log.info("building report %s", job.payload.get("report", "?"))
    _work(job)
    customer = job.payload["customer_id"]  # malformed requests lack it: a KeyError, every attempt
    return customer


@console.task("images.thumbnail")
def thumbnail(job):
    _work(job)


@console.task("search.reindex")
def reindex(job):
    _work(job)
