"""The tasks module of tests/test_worker_claims.py's worker processes: one inline no-op kind, and
nothing else, so the worker's claims are not cut per runtime (a process that also registers
`async def` handlers claims each runtime's kinds apart, at batch_size)."""

import console

KIND = "claims_inline_noop"


# Inline: the main loop runs it itself, so the job counts as fast whatever the machine's load
# (a threaded no-op's measured runtime can pass FAST_JOB when its thread is preempted).
@console.task(KIND, inline=True)
def noop(job):
    return None
