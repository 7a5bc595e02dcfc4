"""``runner.run_all``: every point is announced, a failing point is logged and skipped,
points after the deadline are skipped (partial results survive)."""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

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


def test_stage_times_merge_the_cpu_and_gpu_annotations_of_one_stage() -> None:
    """With CUDA the profiler lists a stage twice (CPU annotation: host time; GPU
    annotation: device span); keeping only the last one lost the host time."""
    from types import SimpleNamespace as E

    from services.decode.gpu_bench.runner import stage_times

    events = [E(key="resolver", device_time_total=0.0, cpu_time_total=4000.0, count=16),
              E(key="resolver", device_time_total=9000.0, cpu_time_total=0.0, count=16),
              E(key="aten::mm", device_time_total=5.0, cpu_time_total=5.0, count=1)]
    assert stage_times(events, 2) == {
        "resolver": {"device_ms": 4.5, "host_ms": 2.0, "calls": 8.0}}


def test_h200_plan_points_have_enough_requests_and_profiles_at_two_loads() -> None:
    from services.decode.gpu_bench.presets import h200_plan

    plan = h200_plan()
    assert [plan.requests(c) for c in (4, 8, 16, 128)] == [16, 16, 24, 192]
    assert plan.serve.concurrency == "4,8,16,32,64,128"
    assert plan.profile_concurrency == (4, 32) and plan.point_s == 45.0


def test_h200_sweep_profiles_every_policy_before_the_first_serve_point() -> None:
    """The speculative profile (host time attribution) must not wait behind the sweep."""
    from services.decode.gpu_bench.presets import h200_plan
    from services.decode.gpu_bench.sweep import points

    plan = h200_plan()  # points are closures: listing them runs nothing
    plan.serve = dataclasses.replace(plan.serve, device="cpu").validate()  # no GPU here
    names = [n for n, _ in points(plan, None, True, SimpleNamespace(data={}),
                                  "resident,hisparse,adaptive,resident-spec,adaptive-spec"
                                  .split(","))]
    first_serve = next(i for i, n in enumerate(names) if n.startswith("serve "))
    profiles = [n for n in names if n.startswith("profile ")]
    assert profiles == [f"profile {p} C{c}" for c in (4, 32)
                        for p in ("hisparse", "adaptive", "adaptive-spec")]
    assert all(names.index(p) < first_serve for p in profiles)


def test_pinned_warmup_covers_the_largest_point_and_is_a_no_op_without_cuda() -> None:
    from services.decode.gpu_bench.presets import cpu_plan, h200_plan
    from services.decode.gpu_bench.sweep import pinned_histories, prewarm_pinned

    plan = h200_plan()
    plan.serve = dataclasses.replace(plan.serve, device="cpu").validate()
    model = plan.serve.engine_config("hisparse", 1).model
    n, size = pinned_histories(plan, model)
    assert n == 128 * model.groups * model.payloads_per_group  # C128, one per source
    assert size == (32768 + 24 + 8) * 656  # max_context rows of 656 bytes
    cpu = cpu_plan()
    assert prewarm_pinned(cpu, cpu.serve.engine_config("hisparse", 1).model) == {}
