"""Reports of the benchmarks: the header, terminal tables, JSON files and PNG plots.

``serve`` plot (paper Fig. 4): (a) output tokens/s against offered concurrency, (b) mean
TTFT against output tokens/s (log axis), (c) mean TPOT against output tokens/s.
``load-step`` plot (paper Fig. 6): (a) allocated request slots, (b) coverage, (c) share of
selected rows fetched from host, against time, one line per arm, phases shaded.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path

import torch
from rich.table import Table

from services.decode.bench.settings import BenchSettings

COLORS = {"resident": "tab:gray", "hisparse": "tab:blue", "adaptive": "tab:green",
          "resident-spec": "tab:orange", "adaptive-spec": "tab:red"}


def git_sha() -> str:
    """``DHISPARSE_GIT_SHA`` when set (the device machine's copy of the tree may carry a
    stale .git), else the checkout's HEAD, else "unknown"."""
    if os.environ.get("DHISPARSE_GIT_SHA"):
        return os.environ["DHISPARSE_GIT_SHA"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       cwd=Path(__file__).parent,
                                       stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict[str, object]:
    info: dict[str, object] = {
        "hostname": platform.node(), "platform": platform.platform(),
        "python": platform.python_version(), "torch": torch.__version__,
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        info["cpu"] = names[0] if names else platform.processor()
    except OSError:
        info["cpu"] = platform.processor()
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def header(command: str, settings: BenchSettings) -> dict[str, object]:
    return {"command": command, "git_sha": git_sha(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": machine(), "config": settings.as_dict(),
            "clock": {"wall": "time.perf_counter (elapsed, real compute)",
                      "cpu": "time.process_time (this process's CPU time)"}[settings.clock]}


def write_json(path: str | Path, head: dict[str, object], **body: object) -> None:
    Path(path).write_text(json.dumps({"header": head, **body}, indent=1) + "\n")


# -- tables ------------------------------------------------------------------------------
def _ms(v: object) -> str:
    return f"{1e3 * float(v):.1f}"  # type: ignore[arg-type]


SERVE_COLUMNS: list[tuple[str, str, object]] = [
    ("policy", "policy", str), ("C", "concurrency", str),
    ("tok/s", "output_tokens_per_s", lambda v: f"{v:.0f}"),
    ("TTFT ms", "ttft_mean_s", _ms), ("p99 TTFT", "ttft_p99_s", _ms),
    ("TPOT ms", "tpot_mean_s", _ms), ("active", "active_mean", lambda v: f"{v:.1f}"),
    ("host", "host_fetch_share", lambda v: f"{v:.3f}"),
    ("cover", "coverage_mean", lambda v: f"{v:.2f}"),
    ("wait ms", "admission_wait_mean_s", _ms),
    ("tok/rnd", "spec_tokens_per_round", lambda v: f"{v:.2f}"),
    ("reclaim", "reclaimed_pages", str), ("popul", "populated_pages", str),
]

LOAD_STEP_COLUMNS: list[tuple[str, str, object]] = [
    ("arm", "policy", str), ("phase", "phase", str), ("C", "concurrency", str),
    ("t s", "start_s", lambda v: f"{v:.1f}"), ("reqs", "requests", str),
    ("slots", "allocated_mean", lambda v: f"{v:.1f}"),
    ("cover", "coverage_mean", lambda v: f"{v:.2f}"),
    ("host", "host_fetch_share", lambda v: f"{v:.3f}"),
    ("TTFT ms", "ttft_mean_s", _ms), ("wait ms", "admission_wait_mean_s", _ms),
    ("TPOT ms", "tpot_mean_s", _ms),
    ("reclaim", "reclaimed_pages", str), ("popul", "populated_pages", str),
]


def table(title: str, rows: Sequence[dict[str, object]],
          columns: list[tuple[str, str, object]]) -> Table:
    t = Table(title=title)
    for name, _, _ in columns:
        t.add_column(name, justify="left" if name in ("policy", "arm") else "right")
    for row in rows:
        t.add_row(*[fmt(row[key]) for _, key, fmt in columns])  # type: ignore[operator]
    return t


# -- plots -------------------------------------------------------------------------------
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_serve(path: str | Path, rows: Sequence[dict[str, object]], title: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    for policy in dict.fromkeys(str(r["policy"]) for r in rows):
        pts = [r for r in rows if r["policy"] == policy]
        c = [r["concurrency"] for r in pts]
        tps = [r["output_tokens_per_s"] for r in pts]
        style = dict(color=COLORS.get(policy), marker="o", label=policy,
                     markerfacecolor="white" if "spec" not in policy else None)
        ax[0].plot(c, tps, **style)
        ax[1].plot(tps, [r["ttft_mean_s"] for r in pts], **style)
        ax[2].plot(tps, [1e3 * float(r["tpot_mean_s"]) for r in pts], **style)
        for x, y, cc in zip(tps, [1e3 * float(r["tpot_mean_s"]) for r in pts], c, strict=True):
            ax[2].annotate(f"C{cc}", (x, y), fontsize=7, xytext=(3, 3),
                           textcoords="offset points")
    ax[0].set(xscale="log", xlabel="Offered concurrency (requests)",
              ylabel="Output throughput (tok/s)", title="a  throughput")
    ax[0].set_xticks(sorted({int(r["concurrency"]) for r in rows}))  # type: ignore[arg-type]
    ax[0].get_xaxis().set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
    ax[0].get_xaxis().set_minor_formatter(plt.matplotlib.ticker.NullFormatter())
    ax[1].set(yscale="log", xlabel="Output throughput (tok/s)",
              ylabel="Mean time to first token (s)", title="b  TTFT")
    ax[2].set(xlabel="Output throughput (tok/s)", ylabel="Mean time per output token (ms)",
              title="c  TPOT")
    for a in ax:
        a.grid(alpha=0.3)
    ax[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_load_step(path: str | Path, timelines: dict[str, dict[str, list[float]]],
                   phase_starts: dict[str, list[float]], schedule: Sequence[int],
                   title: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    panels = [("allocated", "Allocated request slots", "a"),
              ("coverage", "Coverage (ready / eligible)", "b"),
              ("host_fetch_share", "Host-fetched share", "c")]
    for policy, tl in timelines.items():
        label = f"{policy} (residency {'on' if 'adaptive' in policy else 'off'})"
        for a, (key, _, _) in zip(ax, panels, strict=True):
            a.plot(tl["t"], tl[key], color=COLORS.get(policy), label=label,
                   drawstyle="steps-mid")
    first = next(iter(phase_starts.values()), [])
    for i, t0 in enumerate(first):
        for a in ax:
            a.axvline(t0, color="black", lw=0.6, ls=":")
        if i < len(schedule):
            ax[0].annotate(f"C{schedule[i]}", (t0, 1.0), xycoords=("data", "axes fraction"),
                           xytext=(3, -12), textcoords="offset points", fontsize=8)
    for a, (_, ylabel, letter) in zip(ax, panels, strict=True):
        a.set_ylabel(ylabel)
        a.set_title(letter, loc="left", fontsize=9)
        a.grid(alpha=0.3)
    ax[1].set_ylim(-0.05, 1.05)
    ax[2].set_ylim(-0.05, 1.05)
    ax[2].set_xlabel("Time (s)")
    ax[0].legend(fontsize=8, loc="upper right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
