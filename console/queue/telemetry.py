"""OpenTelemetry for the engine: traces of each job from its enqueue to its runs, and the
worker's counters as metrics. Off unless configured, and then nothing here imports
opentelemetry (the `otel` extra): the producer and the worker only ask `current()`.

Turned on by `instrument()`, called where the application sets up OpenTelemetry's SDK (its
tracer and meter providers, or the global ones): in the process that enqueues, enqueues get
producer spans; in the tasks module `skiplock worker` imports, the worker gets consumer spans
and metrics. The application owns its providers and exporters (OTLP or any other); Skiplock
only makes spans and instruments, so it never opens a connection of its own.

Spans (OpenTelemetry's messaging conventions where they fit; `messaging.system` = skiplock):
- `send <queue>` (PRODUCER) around enqueue and enqueue_many: `messaging.destination.name`,
  `skiplock.kind`, `messaging.message.id` (one job) or `messaging.batch.message_count`. Its
  context travels with the job in the `headers` column (W3C `traceparent`/`tracestate`, written
  by the same INSERT: it commits or rolls back with the job);
- `receive` (CONSUMER) for each claim statement that returned jobs, with the statement's own
  start and end, linked to each claimed job's producer span;
- `process <kind>` (CONSUMER) for each run: a child of the job's producer span (so the runs
  appear in the trace of the request that enqueued the job), linked to it and to its claim span;
  current while the handler runs, so the handler's own spans nest under it. Attributes: queue,
  kind, `messaging.message.id`, `skiplock.attempt` and `skiplock.outcome` (completed, retried,
  failed, lost, released), set when the worker has recorded the outcome; the span ends when the
  handler did.

Redaction before export: no payload value is ever an attribute or an event. A failed run's
`exception` event has the error's class and its message through console.redaction.redact_text
with the keys given to `instrument()` (console.redaction's defaults unless told), the
redaction the console applies to error texts; its status description is the class alone.

Metrics (meter `skiplock`): `skiplock.worker.jobs` (counter: finished attempts by
`skiplock.outcome` and, except `lost`, `messaging.destination.name`), `skiplock.worker.claimed`
(counter), `skiplock.worker.in_flight` (gauge), read from the worker's own counters at each
export; `skiplock.claim.duration`, `skiplock.pickup.delay` and `skiplock.run.duration`
(histograms, seconds). `reaped` is counted by the reaper in the database, not by a worker:
the console's /metrics has it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from console.queue.handles import JsonText
from console.redaction import DEFAULT_KEYS, redact_text

if TYPE_CHECKING:
    from console.queue import protocol as q

SYSTEM = "skiplock"
_current: Telemetry | None = None


def current() -> Telemetry | None:
    """The active telemetry, or None (the default: off)."""
    return _current


def instrument(*, tracer_provider: Any = None, meter_provider: Any = None,
               secret_keys: Iterable[str] = DEFAULT_KEYS) -> Telemetry:
    """Turn OpenTelemetry on in this process: enqueues get producer spans and their context
    travels with the job; a worker here gets consumer spans and metrics. The providers default
    to OpenTelemetry's global ones. `secret_keys`: the keys whose values error messages hide
    before export (console.redaction)."""
    global _current
    _current = Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider, secret_keys=secret_keys)
    return _current


def uninstrument() -> None:
    """Turn it off again (what a test does between cases)."""
    global _current
    _current = None


class _Off:
    """What `producing` returns when telemetry is off: no span, no headers."""

    headers: JsonText | None = None

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def sent(self, ids: Sequence[int]) -> None:
        return None


_OFF = _Off()


def producing(queue: str | None, kind: str | None, count: int = 1) -> Any:
    """A context for one enqueue call: `.headers` to write with the job(s), `.sent(ids)` once
    they are inserted. Costs one call and one attribute read when telemetry is off."""
    telemetry = _current
    return _OFF if telemetry is None else _Producing(telemetry, queue, kind, count)


class _Producing:
    def __init__(self, telemetry: Telemetry, queue: str | None, kind: str | None, count: int) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        attributes: dict[str, Any] = {"messaging.system": SYSTEM, "messaging.operation.type": "send"}
        if queue is not None:
            attributes["messaging.destination.name"] = queue
        if kind is not None:
            attributes["skiplock.kind"] = kind
        if count != 1:
            attributes["messaging.batch.message_count"] = count
        self.span = telemetry.tracer.start_span(f"send {queue}" if queue else "send", kind=SpanKind.PRODUCER,
                                                attributes=attributes)
        carrier: dict[str, str] = {}
        telemetry.propagator.inject(carrier, context=trace.set_span_in_context(self.span))
        self.headers = JsonText(json.dumps(carrier, separators=(",", ":"))) if carrier else None
        self._telemetry = telemetry

    def __enter__(self) -> _Producing:
        return self

    def sent(self, ids: Sequence[int]) -> None:
        if len(ids) == 1:
            self.span.set_attribute("messaging.message.id", str(ids[0]))

    def __exit__(self, exc_type: Any, exc: BaseException | None, _tb: Any) -> None:
        if exc is not None:
            self._telemetry.failed(self.span, exc)
        self.span.end()


class Telemetry:
    """The tracer, meter and instruments, made once by `instrument()`."""

    def __init__(self, *, tracer_provider: Any = None, meter_provider: Any = None,
                 secret_keys: Iterable[str] = DEFAULT_KEYS) -> None:
        from opentelemetry import metrics, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracer = trace.get_tracer("skiplock", tracer_provider=tracer_provider)
        self.meter = metrics.get_meter("skiplock", meter_provider=meter_provider)
        # W3C trace context only: baggage would carry the application's values into the table
        # and on to whoever reads the job.
        self.propagator = TraceContextTextMapPropagator()
        self.secret_keys = frozenset(k.lower() for k in secret_keys)
        self._claim_duration = self.meter.create_histogram(
            "skiplock.claim.duration", unit="s", description="Round trip of a claim statement that returned jobs")
        self._pickup_delay = self.meter.create_histogram(
            "skiplock.pickup.delay", unit="s", description="From a job's run_at to its claim")
        self._run_duration = self.meter.create_histogram(
            "skiplock.run.duration", unit="s", description="A handler's run, from its start to its end")
        self._span_api = trace

    # --- shared ---------------------------------------------------------------------------

    def failed(self, span: Any, error: BaseException) -> None:
        """Status ERROR (the class only) and an exception event with the message redacted."""
        from opentelemetry.trace import Status, StatusCode

        name = type(error).__name__
        span.set_status(Status(StatusCode.ERROR, name))
        span.add_event("exception", {"exception.type": name,
                                     "exception.message": redact_text(str(error), self.secret_keys)[:2000]})

    def _producer_context(self, job: q.Job) -> Any:
        """The job's producer span context (from its headers), or None."""
        headers = job.headers
        if not headers or not isinstance(headers, dict):  # only enqueue writes it, but a run must not fail on it
            return None
        ctx = self.propagator.extract({k: v for k, v in headers.items() if isinstance(v, str)})
        span_context = self._span_api.get_current_span(ctx).get_span_context()
        return ctx if span_context.is_valid else None

    # --- the worker -----------------------------------------------------------------------

    def claimed(self, jobs: Sequence[q.Job], seconds: float, worker: str) -> None:
        """A claim statement returned `jobs` after `seconds`: its span (ending now) and the
        pickup delays."""
        from opentelemetry.trace import Link, SpanKind

        end = time.time_ns()
        links = []
        seen = set()
        for job in jobs:
            ctx = self._producer_context(job)
            if ctx is not None:
                span_context = self._span_api.get_current_span(ctx).get_span_context()
                if span_context.span_id not in seen:
                    seen.add(span_context.span_id)
                    links.append(Link(span_context))
        span = self.tracer.start_span("receive", kind=SpanKind.CONSUMER, start_time=end - int(seconds * 1e9),
                                      links=links, attributes={
                                          "messaging.system": SYSTEM, "messaging.operation.type": "receive",
                                          "messaging.batch.message_count": len(jobs), "skiplock.worker": worker})
        span.end(end_time=end)
        claim = span.get_span_context()
        for job in jobs:
            job.extra["otel_claim"] = claim
        self._claim_duration.record(seconds)
        for job in jobs:
            self._pickup_delay.record(max((job.locked_at - job.run_at).total_seconds(), 0.0))

    def run_started(self, job: q.Job) -> Any:
        """Start the run's span, current until `run_ended`; returns what run_ended needs."""
        from opentelemetry import context
        from opentelemetry.trace import Link, SpanKind

        parent = self._producer_context(job)
        links = []
        if parent is not None:
            links.append(Link(self._span_api.get_current_span(parent).get_span_context()))
        claim = job.extra.get("otel_claim")
        if claim is not None:
            links.append(Link(claim))
        span = self.tracer.start_span(f"process {job.kind}", context=parent, kind=SpanKind.CONSUMER, links=links,
                                      attributes={
                                          "messaging.system": SYSTEM, "messaging.operation.type": "process",
                                          "messaging.destination.name": job.queue, "skiplock.kind": job.kind,
                                          "messaging.message.id": str(job.id), "skiplock.attempt": job.attempts})
        job.extra["otel_run"] = span
        token = context.attach(self._span_api.set_span_in_context(span, parent))
        return job, token, time.monotonic()

    def run_ended(self, started: Any, error: BaseException | None) -> None:
        from opentelemetry import context

        job, token, at = started
        context.detach(token)
        job.extra["otel_end"] = time.time_ns()
        self._run_duration.record(time.monotonic() - at)
        span = job.extra.get("otel_run")
        if span is not None and error is not None:
            self.failed(span, error)

    def outcome(self, job: q.Job, outcome: str) -> None:
        """The worker recorded the run's outcome: set it and end the span (at the handler's end)."""
        span = job.extra.pop("otel_run", None)
        if span is not None:
            span.set_attribute("skiplock.outcome", outcome)
            span.end(end_time=job.extra.pop("otel_end", None))

    def watch(self, counters: Any, in_flight: Callable[[], int]) -> None:
        """Export a worker's counters: read at each export, never per job."""
        from opentelemetry.metrics import CallbackOptions, Observation

        def jobs(_options: CallbackOptions) -> Iterable[Observation]:
            for queue, (completed, failed, retried) in list(counters.by_queue.items()):
                for outcome, value in (("completed", completed), ("failed", failed), ("retried", retried)):
                    yield Observation(value, {"skiplock.outcome": outcome, "messaging.destination.name": queue})
            yield Observation(counters.lost, {"skiplock.outcome": "lost"})

        self.meter.create_observable_counter("skiplock.worker.jobs", [jobs], unit="{job}",
                                             description="Finished attempts of this worker, by outcome and queue")
        self.meter.create_observable_counter("skiplock.worker.claimed", [lambda _o: [Observation(counters.claimed)]],
                                             unit="{job}", description="Jobs this worker claimed")
        self.meter.create_observable_gauge("skiplock.worker.in_flight", [lambda _o: [Observation(in_flight())]],
                                           unit="{job}", description="Jobs this worker holds now")
