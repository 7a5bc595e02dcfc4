"""The GPU sweeps, built from the CPU bench's pieces (driver, metrics, report).

Every engine is a ``GpuEngine`` over one ``Shared`` (weights, prefixes). A point's row is
``bench.metrics.serve_row`` plus ``hot_cache``; a load-step arm gives
``bench.metrics.phase_rows`` and ``timeline``. ``profile_step`` runs one decode step of
a filled engine under the torch profiler and attributes device and host time to the
model's stages (indexer, resolver, host copies, row gather, attention, MLP, LM head)
and the engine's (drafter, commit + backup, admission).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import torch

from services.decode.bench.driver import LoadPhase, RunRecord, drive, make_prefixes
from services.decode.bench.metrics import phase_rows, serve_row, timeline
from services.decode.bench.settings import BenchSettings, LoadStepSettings
from services.decode.engine.request import GenerateSpec
from services.decode.gpu_bench.engine import GpuEngine, Shared

STAGES = ("indexer", "resolver", "host_copies", "gather_rows", "kv_write", "attention", "mlp",
          "lm_head", "drafter", "commit+backup", "admission+commands")


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def release(device: str) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def engine_for(settings: BenchSettings, policy: str, slots: int, shared: Shared,
               fused: bool) -> GpuEngine:
    return GpuEngine(settings.engine_config(policy, slots), shared, fused=fused)


def prefixes_of(settings: BenchSettings, shared: Shared) -> list[list[int]]:
    return make_prefixes(shared.model.vocab, settings.input_len, settings.prefixes,
                         settings.seed)


def serve_point(settings: BenchSettings, policy: str, c: int, requests: int, shared: Shared,
                fused: bool, max_seconds: float | None = None
                ) -> tuple[dict[str, object], RunRecord]:
    """One closed-loop point: C in flight until ``requests`` finished (or ``max_seconds``
    passed: the row says ``truncated`` and rates cover the time it ran)."""
    engine = engine_for(settings, policy, c, shared, fused)
    rec = drive(engine, policy, [LoadPhase(c, requests=requests)], prefixes_of(settings, shared),
                settings.output_len, tag=f"c{c}-r", max_seconds=max_seconds)
    sync(settings.device)
    row = serve_row(rec, c)
    row.update(hot_cache=settings.hot_cache, kv_memory=settings.kv_memory,
               input_len=settings.input_len, output_len=settings.output_len)
    return row, rec


def load_step_arm(settings: LoadStepSettings, policy: str, phases: list[LoadPhase],
                  shared: Shared, fused: bool, max_seconds: float | None = None
                  ) -> tuple[list[dict], dict, list[float]]:
    engine = engine_for(settings, policy, max(p.concurrency for p in phases), shared, fused)
    rec = drive(engine, policy, phases, prefixes_of(settings, shared), settings.output_len,
                max_seconds=max_seconds)
    sync(settings.device)
    return phase_rows(rec), timeline(rec), list(rec.phase_starts)


def warm_up(settings: BenchSettings, policy: str, shared: Shared, fused: bool) -> None:
    """Compile/allocate once per policy: 2 requests of 2 tokens, untimed."""
    engine = engine_for(settings, policy, 2, shared, fused)
    drive(engine, policy, [LoadPhase(2, requests=2)], prefixes_of(settings, shared)[:1], 2,
          tag="warm")
    del engine
    release(settings.device)


def fill(engine: GpuEngine, settings: BenchSettings, c: int, shared: Shared,
         output_len: int) -> None:
    """Admit ``c`` requests (all running) and take two warm decode steps."""
    prefixes = prefixes_of(settings, shared)
    for i, tokens in enumerate(prefixes):
        engine.register_prefix(f"p{i}", tokens)
    for i in range(c):
        engine.submit(GenerateSpec(f"prof{i}", output_len, prefix_id=f"p{i % len(prefixes)}"))
    while engine.waiting:
        engine.step()
    for _ in range(2):
        engine.step()
    sync(settings.device)


def profile_step(settings: BenchSettings, policy: str, c: int, shared: Shared, fused: bool,
                 steps: int = 2) -> dict[str, object]:
    """``steps`` decode steps of ``c`` running requests under the torch profiler →
    per-stage device ms and host ms per step, wall ms per step, the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    engine = engine_for(settings, policy, c, shared, fused)
    fill(engine, settings, c, shared, output_len=steps + 8)
    cuda = torch.device(settings.device).type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()  # inside: the profiler's teardown is not a step
        for _ in range(steps):
            engine.step()
        sync(settings.device)
        wall = (time.perf_counter() - t0) / steps
    events = prof.key_averages()
    stages = stage_times(events, steps)
    # stage ranges appear as GPU annotations (spans, idle gaps included): not kernels
    busy = [ev for ev in events
            if getattr(ev, "self_device_time_total", 0) > 0 and ev.key not in STAGES]
    kernels = sorted(busy, key=lambda e: -e.self_device_time_total)[:15]
    device_total = sum(e.self_device_time_total for e in busy)
    out = {"policy": policy, "concurrency": c, "active": len(engine.running),
           "wall_ms_per_step": 1e3 * wall, "device_busy_ms_per_step": device_total / 1e3 / steps,
           "stages": stages,
           "top_kernels": [{"name": e.key[:80], "device_ms": e.self_device_time_total / 1e3 / steps,
                            "calls": e.count / steps} for e in kernels],
           "counts": {f: getattr(engine.stats.counts, f)
                      for f in engine.stats.counts.__slots__}}
    del engine, prof
    release(settings.device)
    return out


def stage_times(events, steps: int) -> dict[str, dict[str, float]]:
    """Per-stage device and host ms per step from profiler averages. With CUDA a stage's
    range appears twice under one name: the CPU-side annotation (host time) and the GPU-side
    one (device span); both are summed into one entry, not the last one kept."""
    stages: dict[str, dict[str, float]] = {}
    for ev in events:
        if ev.key not in STAGES:
            continue
        dev = getattr(ev, "device_time_total", getattr(ev, "cuda_time_total", 0.0))
        row = stages.setdefault(ev.key, {"device_ms": 0.0, "host_ms": 0.0, "calls": 0.0})
        row["device_ms"] += dev / 1e3 / steps
        row["host_ms"] += ev.cpu_time_total / 1e3 / steps
        row["calls"] = max(row["calls"], ev.count / steps)
    return stages


def run_all(points: list[tuple[str, Callable[[], object]]], deadline: float,
            log: Callable[[str], None],
            on_point: Callable[[str], None] | None = None) -> None:
    """Run ``(name, thunk)`` in order while time is left; a failing point is logged and
    skipped, not fatal (partial results survive). ``on_point(name)`` before each point
    (progress display)."""
    for name, thunk in points:
        if on_point is not None:
            on_point(name)
        left = deadline - time.perf_counter()
        if left <= 0:
            log(f"skip {name}: out of time")
            continue
        t0 = time.perf_counter()
        try:
            thunk()
            log(f"done {name} in {time.perf_counter() - t0:.1f}s ({left:.0f}s were left)")
        except Exception as exc:  # a broken point must not lose the rest
            import traceback

            log(f"FAILED {name}: {exc!r}\n{traceback.format_exc()}")
