"""OpenTelemetry (console/queue/telemetry.py): a job's trace context travels from its enqueue,
in the job's headers column, to the worker's spans. The real SDK with its in-memory exporter and
metric reader, a real Worker in a thread (threaded and async handlers), a real PostgreSQL; and
once the way docs/queue.md tells an application to reach its collector, through the OTLP/HTTP
exporters to a real HTTP receiver on loopback whose bodies are parsed as OTLP protobuf."""

from __future__ import annotations

import asyncio
import threading
from contextlib import contextmanager

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from console import queue as q
from console.queue import tasks, telemetry
from console.queue.worker import Worker
from tests.alert_receiver import Receiver
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


@contextmanager
def instrumented(tracer_provider, meter_provider):
    """Telemetry on, with these providers and two kinds registered (one of each runtime);
    everything taken back afterwards, so later tests in this process see neither."""
    telemetry.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    tasks.task("otel_sync")(_sync_handler)
    tasks.task("otel_async")(_async_handler)
    try:
        yield
    finally:
        telemetry.uninstrument()
        for kind in ("otel_sync", "otel_async"):
            tasks._registry.pop(kind, None)
            tasks._concurrency.pop(kind, None)
            tasks._async.discard(kind)


@pytest.fixture
def traced():
    """Telemetry on with this module's in-memory providers; yields the metric reader."""
    reader = InMemoryMetricReader()
    _exporter.clear()
    with instrumented(_tracer_provider, MeterProvider(metric_readers=[reader])):
        yield reader


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


def _otlp_attributes(message) -> dict:
    """An OTLP span's or data point's attributes as a dict of plain values."""
    return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in message.attributes}


def test_the_trace_and_metrics_reach_a_collector_through_otlp(dsn, conn, tx_conn):
    """What docs/queue.md shows an application: the OTLP/HTTP exporters, here pointed at a real
    HTTP server on loopback (tests/alert_receiver.py) that stands in for the collector. What it
    received is parsed as a collector would, and read for the payload byte by byte."""
    payload_secret = "sk_live_otlp_4111_never_exported"
    with Receiver() as collector:
        base = f"http://127.0.0.1:{collector.server.server_address[1]}"
        # No compression, so the bytes the receiver got can be searched for the payload (the
        # positive control below proves the search can see strings at all).
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(
            endpoint=f"{base}/v1/traces", compression=Compression.NoCompression, timeout=10)))
        # An export only when the test flushes: an hour between periodic ones.
        meter_provider = MeterProvider(metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter(
            endpoint=f"{base}/v1/metrics", compression=Compression.NoCompression, timeout=10),
            export_interval_millis=3_600_000)])
        try:
            with instrumented(tracer_provider, meter_provider):
                with tracer_provider.get_tracer("shop").start_as_current_span("POST /orders") as request:
                    with tx_conn.transaction():
                        job_id = q.enqueue(tx_conn, "otel_sync", {"card": payload_secret}, queue=QUEUE)
                # The worker is stopped and joined before this returns: its run's span has ended.
                run_worker_until(dsn, lambda: statuses(conn) == {job_id: "completed"}, "the job completed")
                assert tracer_provider.force_flush(10_000), "the spans were not exported within 10 s"
                assert meter_provider.force_flush(10_000), "the metrics were not exported within 10 s"
        finally:
            tracer_provider.shutdown()
            meter_provider.shutdown()
        received = list(collector.requests)

    assert {r["path"] for r in received} == {"/v1/traces", "/v1/metrics"}, [r["path"] for r in received]
    content_types = {v for r in received for k, v in r["headers"].items() if k.lower() == "content-type"}
    assert content_types == {"application/x-protobuf"}, content_types
    spans = [span for r in received if r["path"] == "/v1/traces"
             for rs in ExportTraceServiceRequest.FromString(r["body"]).resource_spans
             for ss in rs.scope_spans for span in ss.spans]
    (send,) = [s for s in spans if s.name == f"send {QUEUE}"]
    (run,) = [s for s in spans if s.name == "process otel_sync"]
    assert [s for s in spans if s.name == "receive"], "no claim span arrived"
    assert send.kind == OtlpSpan.SPAN_KIND_PRODUCER and run.kind == OtlpSpan.SPAN_KIND_CONSUMER
    assert send.parent_span_id == request.get_span_context().span_id.to_bytes(8, "big")
    assert run.trace_id == send.trace_id, "the run arrived in another trace than its enqueue"
    assert run.parent_span_id == send.span_id, "the run arrived without its send span as parent"
    assert send.span_id in {link.span_id for link in run.links}
    attributes = _otlp_attributes(run)
    assert attributes["messaging.message.id"] == str(job_id)
    assert attributes["messaging.destination.name"] == QUEUE and attributes["skiplock.kind"] == "otel_sync"
    assert attributes["skiplock.attempt"] == 1 and attributes["skiplock.outcome"] == "completed"

    metrics = {m.name: m for r in received if r["path"] == "/v1/metrics"
               for rm in ExportMetricsServiceRequest.FromString(r["body"]).resource_metrics
               for sm in rm.scope_metrics for m in sm.metrics}
    jobs = {(a["skiplock.outcome"], a.get("messaging.destination.name")): p.as_int
            for p in metrics["skiplock.worker.jobs"].sum.data_points for a in [_otlp_attributes(p)]}
    assert jobs[("completed", QUEUE)] == 1
    assert {"skiplock.claim.duration", "skiplock.run.duration", "skiplock.worker.in_flight"} <= set(metrics)

    everything = b"".join(r["body"] for r in received)
    assert b"process otel_sync" in everything  # strings travel as plain bytes: the search below can see them
    assert payload_secret.encode() not in everything, "a payload value reached the collector"
