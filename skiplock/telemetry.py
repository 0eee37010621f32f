"""OpenTelemetry for Skiplock (the `otel` extra): `instrument()` turns on a producer span at each
enqueue, whose trace context travels with the job, and the worker's consumer spans and metrics.
Off until called. docs/queue.md, "Traces and metrics (OpenTelemetry)", says what it exports."""

from console.queue.telemetry import instrument, uninstrument

__all__ = ["instrument", "uninstrument"]
