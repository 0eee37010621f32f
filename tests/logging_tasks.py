"""Handlers that log, for tests/test_attempt_logs.py: the worker keeps their `logging` records
with each attempt (console.queue.joblogs). Sync handlers, run on the worker's handler threads."""

from __future__ import annotations

import logging
import threading

import skiplock

log = logging.getLogger("shop.billing")
# Two jobs that take turns: each logs, then waits for the other at the barrier, so their
# records interleave in time on two handler threads of one process.
_turns = threading.Barrier(2, timeout=20)


@skiplock.task("log_then_fail")
def log_then_fail(job: skiplock.Job) -> None:
    log.info("charging order %s", job.payload.get("order"), extra={"order": job.payload.get("order")})
    log.warning("card declined on attempt %d", job.attempt)
    raise ValueError(f"payment failed for order {job.payload.get('order')}")


@skiplock.task("log_then_succeed")
def log_then_succeed(job: skiplock.Job) -> None:
    log.info("attempt %d of order %s", job.attempt, job.payload.get("order"))
    if job.attempt < job.payload.get("fail_first", 0) + 1:
        raise RuntimeError("the warehouse is busy")
    log.info("order %s shipped", job.payload.get("order"))


@skiplock.task("silent")
def silent(job: skiplock.Job) -> None:
    return None


@skiplock.task("log_flood")
def log_flood(job: skiplock.Job) -> None:
    for i in range(job.payload["n"]):
        log.info("line %d", i)
    log.error("the last words: %s", "x" * job.payload.get("long", 0))
    raise RuntimeError("flooded")


@skiplock.task("log_secret")
def log_secret(job: skiplock.Job) -> None:
    log.info("logging in with password=hunter2 for %s", job.payload["user"],
             extra={"token": "tok-abc123", "note": "api_key=zzz-secret", "nested": {"secret": "s3cr3t", "ok": 1}})
    try:
        raise ConnectionError("authorization: Bearer-xyz-987 refused")
    except ConnectionError:
        log.exception("upstream said no (token=tok-abc123)")
    raise PermissionError("login refused")


@skiplock.task("log_turns")
def log_turns(job: skiplock.Job) -> None:
    tag = job.payload["tag"]
    for i in range(5):
        log.info("%s record %d", tag, i)
        _turns.wait()
    if job.payload.get("fail"):
        raise RuntimeError(f"{tag} failed")
