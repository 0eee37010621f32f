"""bench/pages.py signs in the way the console does and refuses to report timings of error pages."""

from __future__ import annotations

import importlib.util

from tests.conftest import ROOT


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_pages", ROOT / "bench" / "pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_response_is_recorded_and_a_non_200_is_named(dsn, monkeypatch):
    bench = load_bench()
    monkeypatch.setattr(bench, "pages", lambda dsn: [("audit", "/audit"), ("no such page", "/no-such-page")])
    results, bad = bench.measure(dsn, 1)
    assert [(name, status) for name, _, _, status in results] == [("audit", 200), ("no such page", 404)]
    assert bad == ["no such page (/no-such-page): HTTP 404 (3 of 3)"]  # signed in: not a redirect to /login
