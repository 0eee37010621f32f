"""The demo's paced config leaves room for what it promises (console.demo.democonfig): a killed
worker's leases stay expired long enough for the stuck_leases alert to fire before the reaper's
next run rescues them, at every pace. A CI run at --pace 6 missed its first kill's alert when
the reaper ran every 12.5 s against a 9 s lease."""

from __future__ import annotations

import pytest

from console.demo.democonfig import DEMO_RULES, demo_settings


def _seconds(text: str) -> float:
    assert text.endswith("s"), text
    return float(text[:-1])


@pytest.mark.parametrize("pace", [1.0, 2.0, 3.0, 6.0, 10.0, 20.0])
def test_a_killed_workers_leases_stay_expired_long_enough_for_the_alert(pace):
    settings = demo_settings(pace)
    reap, lease, collect = (settings[k] for k in ("scheduler.reap_interval", "worker.lease", "scheduler.collect_interval"))
    alert_for = max(DEMO_RULES["stuck_leases"]["for"] / pace, 1.0)
    # The kill comes at most a sixth of the reaper's interval after its run (Demo._ripe), so
    # the next run is at least five sixths of it away; the leases expire at most `lease` after
    # the kill. Between the two, the rule needs its `for` and three collections (the sample that
    # sees the leases, the evaluation after `for`, and one late cycle on a loaded machine).
    stuck_window = reap * 5 / 6 - lease
    needed = alert_for + 3 * collect
    assert stuck_window >= needed, (
        f"at pace {pace:g} the reaper ({reap:g} s) rescues a killed worker's jobs {stuck_window:.1f} s after their "
        f"leases ({lease:g} s) expire, and stuck_leases needs {needed:.1f} s to fire")
