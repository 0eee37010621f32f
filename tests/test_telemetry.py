"""OpenTelemetry (console/queue/telemetry.py): a job's trace context travels from its enqueue,
in the job's headers column, to the worker's spans. The real SDK with its in-memory exporter and
metric reader, a real Worker in a thread (threaded and async handlers), a real PostgreSQL."""

from __future__ import annotations

import asyncio
import threading

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from console import queue as q
from console.queue import tasks, telemetry
from console.queue.worker import Worker
from tests.workers import wait_for

QUEUE = "otel"
SECRET = "hunter2-do-not-export"
_tracer_provider = TracerProvider()
_exporter = InMemorySpanExporter()
_tracer_provider.add_span_processor(SimpleSpanProcessor(_exporter))
_tracer = _tracer_provider.get_tracer("shop")


def _sync_handler(job):
    with _tracer.start_as_current_span("charge card"):
        if job.payload.get("fail"):
            raise RuntimeError(f"card refused: password={SECRET}")


async def _async_handler(job):
    with _tracer.start_as_current_span("call api"):
        await asyncio.sleep(0.01)


@pytest.fixture
def traced():
    """Telemetry on, with this module's providers and two kinds registered (one of each
    runtime); everything taken back afterwards, so later tests in this process see neither."""
    reader = InMemoryMetricReader()
    _exporter.clear()
    telemetry.instrument(tracer_provider=_tracer_provider, meter_provider=MeterProvider(metric_readers=[reader]))
    tasks.task("otel_sync")(_sync_handler)
    tasks.task("otel_async")(_async_handler)
    try:
        yield reader
    finally:
        telemetry.uninstrument()
        for kind in ("otel_sync", "otel_async"):
            tasks._registry.pop(kind, None)
            tasks._concurrency.pop(kind, None)
            tasks._async.discard(kind)


def run_worker_until(dsn: str, done, what: str) -> None:
    worker = Worker(dsn, queues=[QUEUE], concurrency=2, batch_size=5, lease=60, poll_interval=0.2,
                    flush_interval=0.5, vacuum_interval=0, name="otel-worker")
    thread = threading.Thread(target=worker.run, name="otel-worker")
    thread.start()
    try:
        wait_for(done, timeout=30, what=what)
    finally:
        worker.stop()
        thread.join(timeout=20)
    assert not thread.is_alive(), "the worker did not stop within 20 s"


def statuses(conn) -> dict[int, str]:
    return dict(conn.execute("SELECT id, status FROM skiplock.jobs WHERE queue = %s", (QUEUE,)).fetchall())


def spans_named(prefix: str):
    return [s for s in _exporter.get_finished_spans() if s.name.startswith(prefix)]


def test_a_jobs_runs_are_in_the_trace_of_the_request_that_enqueued_it(traced, dsn, conn):
    with _tracer.start_as_current_span("POST /orders") as request:
        sync_id = q.enqueue(conn, "otel_sync", {"card": "4111"}, queue=QUEUE)
        async_id = q.enqueue(conn, "otel_async", {"card": "4111"}, queue=QUEUE)
    headers = conn.execute("SELECT headers FROM skiplock.jobs WHERE id = %s", (sync_id,)).fetchone()[0]
    assert set(headers) == {"traceparent"}, headers  # W3C trace context only, no baggage
    # No span ends before its outcome is recorded: wait for the spans, not only the rows.
    run_worker_until(dsn, lambda: statuses(conn) == {sync_id: "completed", async_id: "completed"}
                     and len(spans_named("process")) == 2, "both jobs completed and their spans ended")

    trace_id = request.get_span_context().trace_id
    sends = {s.attributes["messaging.message.id"]: s for s in spans_named("send")}
    assert set(sends) == {str(sync_id), str(async_id)}
    receives = spans_named("receive")
    assert receives and all(r.kind is SpanKind.CONSUMER for r in receives)
    for job_id, handler_span in ((sync_id, "charge card"), (async_id, "call api")):
        send = sends[str(job_id)]
        assert send.kind is SpanKind.PRODUCER and send.parent.span_id == request.get_span_context().span_id
        (run,) = [s for s in spans_named("process") if s.attributes["messaging.message.id"] == str(job_id)]
        assert run.context.trace_id == trace_id, "the run is not in the enqueuing request's trace"
        assert run.parent.span_id == send.context.span_id, "the run is not a child of its producer span"
        linked = {link.context.span_id for link in run.links}
        assert send.context.span_id in linked
        assert linked & {r.context.span_id for r in receives}, "the run is not linked to its claim"
        assert run.attributes["skiplock.outcome"] == "completed" and run.attributes["skiplock.attempt"] == 1
        assert run.attributes["messaging.destination.name"] == QUEUE
        (inner,) = spans_named(handler_span)
        assert inner.parent.span_id == run.context.span_id, f"{handler_span!r} does not nest under its run"

    metrics = {m.name: m for rm in traced.get_metrics_data().resource_metrics
               for sm in rm.scope_metrics for m in sm.metrics}
    jobs = {(p.attributes["skiplock.outcome"], p.attributes.get("messaging.destination.name")): p.value
            for p in metrics["skiplock.worker.jobs"].data.data_points}
    assert jobs[("completed", QUEUE)] == 2
    assert {"skiplock.claim.duration", "skiplock.run.duration", "skiplock.worker.in_flight"} <= set(metrics)


def test_a_failed_run_exports_its_outcome_and_a_redacted_error_and_never_the_payload(traced, dsn, conn):
    job_id = q.enqueue(conn, "otel_sync", {"fail": True, "card": "4111-secret-payload"}, queue=QUEUE, max_attempts=1)
    run_worker_until(dsn, lambda: statuses(conn) == {job_id: "failed"} and spans_named("process"),
                     "the job dead-lettered and its span ended")
    (run,) = spans_named("process")
    assert run.attributes["skiplock.outcome"] == "failed"
    assert run.status.description == "RuntimeError"
    (event,) = [e for e in run.events if e.name == "exception"]
    assert "card refused" in event.attributes["exception.message"]
    # Skiplock's spans only: the handler's own span ("charge card") records its exception as
    # the application's SDK does, which is the application's to redact.
    ours = [s for s in _exporter.get_finished_spans() if s.instrumentation_scope.name == "skiplock"]
    assert {s.name.split()[0] for s in ours} == {"send", "receive", "process"}
    exported = repr([(s.name, s.attributes, [(e.name, e.attributes) for e in s.events], s.status.description)
                     for s in ours])
    assert SECRET not in exported, "a secret in the error message was exported"
    assert "4111-secret-payload" not in exported, "a payload value was exported"


def test_off_by_default_a_job_carries_no_headers_and_a_rolled_back_enqueue_none_at_all(dsn, conn, tx_conn):
    assert telemetry.current() is None
    job_id = q.enqueue(conn, "otel_sync", {}, queue=QUEUE)
    assert conn.execute("SELECT headers FROM skiplock.jobs WHERE id = %s", (job_id,)).fetchone()[0] is None
    telemetry.instrument(tracer_provider=_tracer_provider)
    try:
        with pytest.raises(LookupError):
            with tx_conn.transaction():
                q.enqueue(tx_conn, "otel_sync", {}, queue=QUEUE)
                raise LookupError("the order failed after its job was enqueued")
    finally:
        telemetry.uninstrument()
    assert statuses(conn) == {job_id: "pending"}, "the rolled-back enqueue left a job"


def test_every_enqueue_path_writes_its_send_spans_context_with_the_jobs(traced, conn):
    from console.queue.producer import COPY_THRESHOLD

    paths = {
        "one": lambda: [q.enqueue(conn, "otel_sync", {}, queue=QUEUE)],
        "unique": lambda: [q.enqueue(conn, "otel_sync", {}, queue=QUEUE, idempotency_key="k", unique_for=60)],
        "insert": lambda: q.enqueue_many(conn, [q.NewJob("otel_sync", {}, queue=QUEUE) for _ in range(3)]),
        "copy": lambda: q.enqueue_many(conn, [q.NewJob("otel_sync", {}, queue=QUEUE) for _ in range(COPY_THRESHOLD)]),
    }
    for path, enqueue in paths.items():
        _exporter.clear()
        ids = enqueue()
        (send,) = spans_named("send")
        # traceparent: version-trace id-parent (span) id-flags
        parents = conn.execute("SELECT DISTINCT left(headers->>'traceparent', 52) FROM skiplock.jobs "
                               "WHERE id = ANY(%s)", (ids,)).fetchall()
        expected = f"00-{send.context.trace_id:032x}-{send.context.span_id:016x}"
        assert parents == [(expected,)], f"{path}: the jobs carry {parents}, not their send span's context"
