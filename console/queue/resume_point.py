"""Where a worker's next claim starts: at the head of the claim index, or after its last claim.

Every claimed job leaves an entry behind at the head of the claim index (jobs_claim_idx holds
pending rows only; a claimed row's entry points at a version that is no longer pending). A scan
marks such entries dead as it passes them, and the next scan skips them for free, but only once
no snapshot can still see the old version. While a session holds the xmin horizon (a long
report in REPEATABLE READ, a transaction left idle, a standby's feedback) nothing can be marked:
every claim walks, and visits the heap for, every entry of every job claimed since the holder
began. Measured (bench/xmin_holder.py): a three-minute holder took a two-worker queue to a
third of its throughput after 30 s, and lower the longer it held.

So a worker whose claim from the head turns slow claims on from where its last claim ended:
the same statement with the range `priority = p AND (run_at, id) > (r, i)` (protocol
`complete_and_claim(after=...)`), which the index starts at that key instead of the head. Rows
before the key are jobs this worker or another has claimed, or rows another transaction had
locked when the claim skipped them (SKIP LOCKED): nothing due is left behind except those, and
jobs enqueued later at a higher priority. A claim from the head again every `head_interval`
(at least MIN_HEAD_S, and at least HEAD_COST_SHARE of the time: the slow head claim costs
at most that share of the worker) picks them up, so the price of the mode is a bounded wait
for a higher-priority job or a skipped row, never a lost one. A head claim that is fast again,
or a claim after the key that comes back short (its priority has no more due rows), ends it.

Only the worker's plain claim resumes; the claims of limited and fair queues, of one kind
(batch top-ups) and of a worker with both runtimes start at the head as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

# A full claim from the head that takes this long is walking something: a batch of ten no-op
# jobs completes and claims in 1-3 ms on a loaded two-core machine (docs/benchmarks.md), and
# about ten times that after half a minute of a horizon holder.
SLOW_S = 0.015
# ... and 1 % more for every job the claim asked for (twice as long for 100): adaptive claims
# (worker.claim_max) ask for up to 100 at once, and a full claim of 100 took 5-15 ms on a quiet
# two-core machine with no holder at all (docs/benchmarks.md, "Adaptive claims"). The dead
# entries a holder leaves cost the same however many jobs the claim asks for, so they still show.
PER_JOB_SHARE = 0.01
MIN_HEAD_S = 1.0
HEAD_COST_SHARE = 0.05


class _Claimed(Protocol):
    id: int
    priority: int
    run_at: datetime


Key = tuple[int, datetime, int]


def last_key(jobs: Sequence[_Claimed]) -> Key:
    """The claim index's position of the last of `jobs` in its order (priority DESC, run_at, id):
    a claim's RETURNING comes in no particular order."""
    job = max(jobs, key=lambda j: (-j.priority, j.run_at, j.id))
    return (job.priority, job.run_at, job.id)


class ResumePoint:
    """One claiming loop's choice between the head and its last claim's key (not thread-safe:
    the worker's main loop owns it)."""

    def __init__(self, slow_s: float = SLOW_S, min_head_s: float = MIN_HEAD_S,
                 head_cost_share: float = HEAD_COST_SHARE) -> None:
        self.slow_s = slow_s
        self.min_head_s = min_head_s
        self.head_cost_share = head_cost_share
        self.key: Key | None = None
        self.head_at = 0.0  # monotonic time of the next claim from the head while resuming
        self.resumed = 0    # claims made after a key (only the tests read it: the registry has no column for it)

    def point(self, now: float) -> Key | None:
        """The key to claim after, or None to claim from the head."""
        if self.key is not None and now < self.head_at:
            return self.key
        return None

    def observe(self, after: Key | None, jobs: Sequence[_Claimed], asked: int, seconds: float, now: float) -> str | None:
        """What the claim made with `after` (None: from the head) returned, and how long it took.
        Returns "resuming" or "at the head" when the mode changed (the worker logs it), else None."""
        was = self.key is not None
        if after is None:
            if asked > 0 and len(jobs) == asked and seconds >= self.slow_s * (1 + asked * PER_JOB_SHARE):
                self.key = last_key(jobs)
                self.head_at = now + max(self.min_head_s, seconds / self.head_cost_share)
            else:
                self.key = None
        else:
            self.resumed += 1
            self.key = last_key(jobs) if jobs and len(jobs) == asked else None
        if was == (self.key is not None):
            return None
        return "resuming" if self.key is not None else "at the head"
