"""``runner.run_all``: every point is announced, a failing point is logged and skipped,
points after the deadline are skipped (partial results survive)."""

from __future__ import annotations

import time

from services.decode.gpu_bench.runner import run_all


def test_points_run_in_order_failures_and_late_points_are_logged_not_fatal() -> None:
    ran, seen, log = [], [], []

    def boom() -> None:
        raise RuntimeError("point broke")

    points = [("a", lambda: ran.append("a")), ("b", boom), ("c", lambda: ran.append("c"))]
    run_all(points, time.perf_counter() + 60, log.append, on_point=seen.append)
    assert ran == ["a", "c"] and seen == ["a", "b", "c"]
    assert any(line.startswith("FAILED b: RuntimeError('point broke')") for line in log)
    ran.clear()
    run_all(points, time.perf_counter() - 1, log.append)
    assert ran == [] and log[-1] == "skip c: out of time"
