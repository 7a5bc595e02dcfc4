"""The one-shot device script: every experiment of the ``h200`` preset in one process.

    PYTHONUNBUFFERED=1 python -m services.decode.gpu_bench.sweep --out $OUT --budget-s 480

Order (most informative first; each point is skipped once the budget is spent): ceilings
(pinned H2D memcpy, D2D copy), one-step profiles, the serve sweep (paper Fig. 4), the
load step (Fig. 6), the hot-cache sweep (Fig. 9). After every point ``h200_results.json``
and the PNGs are rewritten, so a timeout loses only the point in flight. ``--cpu`` runs
the same code on the CPU demo model (a dry run).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from services.decode.bench import report
from services.decode.bench.driver import LoadPhase
from services.decode.engine.policies import get_policy
from services.decode.gpu_bench.engine import Shared
from services.decode.gpu_bench.presets import (
    H200_CONCURRENCY,
    Plan,
    cpu_plan,
    h200_plan,
    with_hot_cache,
)
from services.decode.gpu_bench.runner import (
    load_step_arm,
    profile_step,
    release,
    run_all,
    serve_point,
    warm_up,
)


def pinned_histories(plan: Plan, model) -> tuple[int, int]:
    """(count, bytes) of the host histories the sweep's largest point holds at once: one
    per payload source and request in flight, ``max_context`` rows each."""
    s = plan.serve
    return (max(s.concurrencies) * model.groups * model.payloads_per_group,
            s.engine_config("hisparse", 1).max_context * model.row_bytes)


def prewarm_pinned(plan: Plan, model) -> dict[str, float]:
    """Pin the host memory of ``pinned_histories`` once, then free it into torch's caching
    host allocator, like a server that reserves its host pool at start: every point then
    opens its histories from memory pinned up front instead of paying cudaHostAlloc
    inside its timed run (a first point at C32 spent 5.7 s of 8.6 s outside decode steps
    in run 17). Returns what it did ({} without CUDA)."""
    if torch.device(plan.serve.device).type != "cuda":
        return {}
    n, size = pinned_histories(plan, model)
    t0 = time.perf_counter()
    blocks = [torch.empty(size, dtype=torch.uint8, pin_memory=True) for _ in range(n)]
    del blocks
    return {"histories": n, "bytes_each": size, "seconds": time.perf_counter() - t0}


def ceilings(device: str) -> dict[str, float]:
    """Pinned host→device memcpy and device→device copy, GB/s (median of 5)."""
    if torch.device(device).type != "cuda":
        return {}
    n = 1 << 30
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)

    def timed(fn) -> float:
        out = []
        for _ in range(6):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            out.append(s.elapsed_time(e) / 1e3)
        return sorted(out[1:])[2]

    h2d = n / timed(lambda: a.copy_(host, non_blocking=True)) / 1e9
    d2d = 2 * n / timed(lambda: b.copy_(a)) / 1e9
    return {"pinned_h2d_GBps": h2d, "d2d_read_plus_write_GBps": d2d}


class Results:
    """``h200_results.json`` + PNGs under ``out``, rewritten after every point."""

    def __init__(self, out: Path, plan: Plan, fused: bool, prefix: str) -> None:
        self.out, self.plan, self.prefix = out, plan, prefix
        head = report.header("gpu-sweep", plan.serve)
        head["load_step_config"] = plan.load_step.as_dict()
        head["fused_resolver"] = fused
        head["hot_caches"], head["hot_loads"] = plan.hot_caches, plan.hot_loads
        self.data: dict[str, object] = {"header": head, "ceilings": {}, "profiles": [],
                                        "serve": [], "load_step": [], "timelines": {},
                                        "phase_starts": {}, "hot_cache": [], "log": []}
        self.title = (f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'CPU'}"
                      f" · {plan.serve.preset} · input {plan.serve.input_len} · "
                      f"M={plan.serve.kv_memory} · git {head['git_sha']} · "
                      f"{str(head['date'])[:10]}")

    def path(self, name: str) -> Path:
        return self.out / f"{self.prefix}{name}"

    def log(self, line: str) -> None:
        stamp = f"[{time.strftime('%H:%M:%S')}] {line}"
        print(stamp, flush=True)
        self.data["log"].append(stamp)  # type: ignore[union-attr]

    def save(self) -> None:
        self.path("results.json").write_text(json.dumps(self.data, indent=1, default=str))
        serve = self.data["serve"]
        if serve:
            report.plot_serve(self.path("serve.png"), serve,  # type: ignore[arg-type]
                              f"serve (B={self.plan.serve.hot_cache}) · {self.title}")
        if self.data["timelines"]:
            report.plot_load_step(self.path("load_step.png"), self.data["timelines"],
                                  self.data["phase_starts"],
                                  self.plan.load_step.concurrencies,
                                  f"load step · {self.title}")
        if self.data["hot_cache"]:  # + the serve sweep's own B at the same loads
            plan = self.plan
            rows = self.data["hot_cache"] + [
                r for r in serve if r["concurrency"] in plan.hot_loads  # type: ignore[union-attr]
                and r["policy"] in plan.hot_policies]
            plot_hot_cache(self.path("hot_cache.png"), rows,
                           f"hot-cache budget · {self.title}")


def plot_hot_cache(path: Path, rows: list[dict], title: str) -> None:
    """Paper Fig. 9: output and host-fetched share against B, per load and policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = sorted({r["concurrency"] for r in rows})
    fig, ax = plt.subplots(2, len(loads), figsize=(5 * len(loads), 6.5), squeeze=False)
    for i, c in enumerate(loads):
        for policy in dict.fromkeys(r["policy"] for r in rows):
            pts = sorted((r for r in rows if r["policy"] == policy and r["concurrency"] == c),
                         key=lambda r: r["hot_cache"])
            b = [r["hot_cache"] for r in pts]
            style = dict(color=report.COLORS.get(policy), marker="o", label=policy)
            ax[0][i].plot(b, [r["output_tokens_per_s"] for r in pts], **style)
            ax[1][i].plot(b, [100 * r["host_fetch_share"] for r in pts], **style)
        ax[0][i].set(title=f"C{c}", ylabel="Output throughput (tok/s)", xscale="log")
        ax[1][i].set(xlabel="Hot-cache budget B (rows)", ylabel="Fetched from host (%)",
                     xscale="log")
        for a in (ax[0][i], ax[1][i]):
            a.grid(alpha=0.3)
        ax[0][i].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def points(plan: Plan, shared: Shared, fused: bool, res: Results, policies: list[str]):
    s, dev = plan.serve, plan.serve.device
    d = res.data

    def profile(policy: str, c: int):
        def run():
            d["profiles"].append(profile_step(s, policy, c, shared, fused))
            res.save()
        return run

    def serve(policy: str, c: int, settings=s, key="serve"):
        def run():
            row, _ = serve_point(settings, policy, c, plan.requests(c), shared, fused,
                                 plan.point_s)
            d[key].append(row)
            res.log(f"{key} {policy} C{c} B={settings.hot_cache}: "
                    f"{row['output_tokens_per_s']:.1f} tok/s, TPOT "
                    f"{1e3 * row['tpot_mean_s']:.1f} ms, TTFT {row['ttft_mean_s']:.2f} s, "
                    f"host {row['host_fetch_share']:.4f}, cover {row['coverage_mean']:.2f}, "
                    f"active {row['active_mean']:.1f}, tok/rnd "
                    f"{row['spec_tokens_per_round']:.2f}"
                    + (f", TRUNCATED at {row['duration_s']:.0f}s "
                       f"({row['finished_requests']}/{row['requests']} finished)"
                       if row["truncated"] else ""))
            release(dev)
            res.save()
        return run

    def arm(policy: str):
        ls = plan.load_step
        phases = [LoadPhase(c, requests=(plan.high_phase_requests if c == max(ls.concurrencies)
                                         else plan.low_phase_requests))
                  for c in ls.concurrencies]

        def run():
            rows, tl, starts = load_step_arm(ls, policy, phases, shared, fused,
                                             plan.point_s and 4 * plan.point_s)
            d["load_step"].extend(rows)
            d["timelines"][policy], d["phase_starts"][policy] = tl, starts
            release(dev)
            res.save()
        return run

    # profiles first (one step each; they explain every figure, the speculative one
    # attributes the speculative policy's host time); then the serve sweep of the
    # non-speculative policies over every C (the crossover figure survives a budget the
    # slower speculative points would exhaust), the load step, the speculative serve
    # points, the hot-cache sweep
    def speculative(names: list[str]) -> tuple[list[str], list[str]]:
        """(plain, speculative) policies of ``names``, in order."""
        flags = [get_policy(n).speculative for n in names]
        return ([n for n, f in zip(names, flags, strict=True) if not f],
                [n for n, f in zip(names, flags, strict=True) if f])

    out = [(f"warm {p}", lambda p=p: warm_up(s, p, shared, fused)) for p in policies]
    plain_prof, spec = speculative(plan.profile_policies)
    out += [(f"profile {p} C{c}", profile(p, c)) for c in plan.profile_concurrency
            for p in plain_prof + spec]
    plain, later = speculative(policies)
    out += [(f"serve {p} C{c}", serve(p, c)) for c in s.concurrencies for p in plain]
    out += [(f"load-step {p}", arm(p)) for p in plan.load_step.policies]
    out += [(f"serve {p} C{c}", serve(p, c)) for c in s.concurrencies for p in later]
    for c in plan.hot_loads:
        for b in plan.hot_caches:
            hs = with_hot_cache(s, b)
            out += [(f"hot B={b} {p} C{c}", serve(p, c, hs, "hot_cache"))
                    for p in plan.hot_policies]
    return out


def progress():
    """A transient rich progress bar on stderr (the log lines stay on stdout)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--cpu", action="store_true", help="dry run on the CPU demo model")
    ap.add_argument("--fused", action="store_true", help="use kernels.resolver on CUDA")
    ap.add_argument("--output-len", type=int, default=24)
    ap.add_argument("--concurrency", default=H200_CONCURRENCY)
    ap.add_argument("--point-s", type=float, default=45.0,
                    help="wall cap of one serve point (x4 for a load-step arm)")
    ap.add_argument("--policies", default="resident,hisparse,adaptive,resident-spec,adaptive-spec")
    ap.add_argument("--only", default="", help="comma list of point-name prefixes to run")
    ap.add_argument("--prefix", default="h200_")
    ap.add_argument("--no-pinned-warmup", action="store_true",
                    help="do not pin the largest point's host histories up front")
    a = ap.parse_args()
    deadline = time.perf_counter() + a.budget_s
    plan = cpu_plan() if a.cpu else h200_plan(a.output_len, a.concurrency, a.point_s)
    plan.serve.validate()
    plan.load_step.validate()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = Results(out, plan, a.fused, a.prefix)
    t0 = time.perf_counter()
    res.data["ceilings"] = ceilings(plan.serve.device)
    shared = Shared.build(plan.serve.engine_config("resident", 1).model)
    res.log(f"ceilings {res.data['ceilings']}; weights in {time.perf_counter() - t0:.1f}s; "
            f"fused={a.fused}")
    if not a.no_pinned_warmup:
        res.data["pinned_warmup"] = prewarm_pinned(plan, shared.model)
        res.log(f"pinned warm-up {res.data['pinned_warmup']}")
    res.save()
    todo = points(plan, shared, a.fused, res, a.policies.split(","))
    if a.only:
        keep = tuple(x.strip() for x in a.only.split(","))
        todo = [(n, f) for n, f in todo if n.startswith(keep)]
    with progress() as bar:  # points done / planned, the running point's name
        task, started = bar.add_task("sweep", total=len(todo)), iter(range(len(todo)))
        run_all(todo, deadline, res.log, on_point=lambda name: bar.update(
            task, completed=next(started), description=name))
        bar.update(task, completed=len(todo))
    res.save()
    res.log("sweep finished")
    res.save()


if __name__ == "__main__":
    main()
