"""The broker worker's ack retry (console/queue/broker/natsworker.py `NatsWorker._ack`): an ack
the broker does not answer in time is sent again until the broker answers, so a job that ran to
completion is settled and counted once, not left to the ack wait (a second run) with a warning.

The broker stops answering for real: the private nats-server (tests/nats_helpers.py) is frozen
with SIGSTOP by the handler itself, just before the worker acks, and thawed with SIGCONT a few
seconds later, shorter than the ack wait. So the first ack (and its wait for the server's
confirmation) times out, which is the condition the retry is for (`relay.unavailable`: no answer
in time), and the next one is answered once the server runs again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import threading
import time
from datetime import UTC, datetime

import console
from console.queue import broker
from tests import nats_helpers
from tests.nats_helpers import _run, consumer_state, stream_messages

nats_server = nats_helpers.nats_server

QUEUE = "acks"
LEASE = 4.0  # the ack wait: each ack waits lease/2 = 2 s for its answer
FROZEN = 3.0  # seconds the server is stopped: longer than one ack's wait, shorter than the ack wait
RUNS: list[int] = []
SERVER: dict[str, str] = {}


@console.task("freeze_broker_then_finish")
def freeze_broker_then_finish(job):
    """Runs, then stops the broker (SIGSTOP) for FROZEN seconds: the worker's ack comes next."""
    RUNS.append(job.id)
    proc = nats_helpers.RUNNING[SERVER["url"]]
    proc.send_signal(signal.SIGSTOP)
    threading.Timer(FROZEN, proc.send_signal, (signal.SIGCONT,)).start()


async def _publish_job(nats_url: str, job_id: int) -> None:
    import nats

    from console.queue.broker.relay import ensure_streams

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js, QUEUE, 120.0)
        now = datetime.now(UTC).isoformat()
        body = {"id": job_id, "queue": QUEUE, "kind": "freeze_broker_then_finish", "payload": {}, "priority": 0,
                "run_at": now, "max_attempts": 3, "idempotency_key": None, "headers": None, "created_at": now}
        await js.publish(broker.subject(QUEUE), json.dumps(body).encode(),
                         headers={broker.MSG_ID: f"job-{job_id}", broker.JOB_ID: str(job_id)})
    finally:
        await nc.close()


def test_an_ack_the_frozen_broker_does_not_answer_is_sent_again_and_the_job_is_settled_once(nats_server, caplog):
    from console.queue.broker.natsworker import NatsWorker

    SERVER["url"] = nats_server
    RUNS.clear()
    _run(_publish_job(nats_server, 901))
    worker = NatsWorker(nats_server, queues=[QUEUE], concurrency=1, lease=LEASE, poll_interval=0.2,
                        shutdown_grace=2.0)
    loop_box: dict[str, asyncio.AbstractEventLoop] = {}
    result: dict[str, int] = {}

    def serve() -> None:
        async def main() -> int:
            loop_box["loop"] = asyncio.get_running_loop()
            return await worker.run()

        result["rc"] = asyncio.run(main())

    caplog.set_level(logging.INFO, logger="skiplock.worker")
    thread = threading.Thread(target=serve, name="nats-worker")
    thread.start()
    try:
        deadline = time.monotonic() + FROZEN + LEASE + 10
        while worker.completed + worker.failed == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        # Past one more ack wait: a job whose ack was given up on would be delivered again now.
        time.sleep(LEASE + 0.5)
    finally:
        loop = loop_box.get("loop")
        if loop is not None:
            loop.call_soon_threadsafe(worker.stop)
        thread.join(timeout=20)
        nats_helpers.RUNNING[nats_server].send_signal(signal.SIGCONT)  # never leave it frozen
    assert not thread.is_alive() and result.get("rc") == 0
    unsettled = [r.getMessage() for r in caplog.records if "could not settle" in r.getMessage()]
    assert unsettled == [], unsettled
    assert (worker.completed, worker.failed, worker.retried) == (1, 0, 0)
    assert RUNS == [901]  # ran once: settled, never handed out again
    assert stream_messages(nats_server, broker.stream(QUEUE)) == 0
    state = consumer_state(nats_server, broker.stream(QUEUE), broker.CONSUMER)
    assert (state["ack_pending"], state["redelivered"]) == (0, 0), state

