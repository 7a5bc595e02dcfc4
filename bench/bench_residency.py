"""``dhisparse bench residency``: admissions per second and Admit latency p50/p99.

For each simulated cluster size (1, 8, 64 workers) a fresh controller process
(``python -m services.residency``) serves on loopback; every worker is a
:class:`SimulatedWorker` with a live Session that acknowledges commands at once. The
client keeps ``concurrency`` Admit calls in flight; each granted request is released
right away (Admit + Release = one admission). Pools are sized so that the 1-worker case
runs under pressure (reclaims: Backup → Retire round trips through the Session) and the
larger ones mostly do not. Latency covers the Admit RPC only, including any wait.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc

from services.common.gen.dhisparse.v1 import residency_pb2 as pb
from services.common.gen.dhisparse.v1 import residency_pb2_grpc
from services.residency.simworker import SimulatedWorker

REPO = Path(__file__).resolve().parent.parent
CAPACITY_PAGES = 1024     # per worker; 32 in flight × (4 + 32) pages overflows one worker
REQUIRED_PAGES, HISTORY_PAGES = 4, 32


@dataclass(frozen=True, slots=True)
class BenchParams:
    workers: tuple[int, ...] = (1, 8, 64)
    admissions: int = 2000
    concurrency: int = 32


def _git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _percentile(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * q))]


class _Controller:
    def __enter__(self) -> int:
        self._tmp = tempfile.TemporaryDirectory()
        port_file = Path(self._tmp.name) / "port"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.residency", "--port", "0", "--port-file",
             str(port_file), "--log-level", "WARNING"],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("residency controller did not start")
            time.sleep(0.02)
        return int(port_file.read_text())

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(15)
        self._tmp.cleanup()


async def _one_size(port: int, n_workers: int, p: BenchParams) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = residency_pb2_grpc.ResidencyStub(ch)
        workers = [SimulatedWorker(stub, pb.RegisterWorkerRequest(
            worker_id=f"w{i:03d}", capacity_pages=CAPACITY_PAGES, reserve_pages=16,
            request_slots=64)) for i in range(n_workers)]
        for w in workers:
            await w.start()
        while len((await stub.GetState(pb.GetStateRequest())).workers) < n_workers:
            await asyncio.sleep(0.01)
        latencies: list[float] = []
        next_id = iter(range(10**9))

        async def client(count: int) -> None:
            for _ in range(count):
                rid = f"r{next(next_id)}"
                t0 = time.perf_counter()
                await stub.Admit(pb.AdmitRequest(request_id=rid, required_pages=REQUIRED_PAGES,
                                                 history_pages=HISTORY_PAGES), timeout=30)
                latencies.append(time.perf_counter() - t0)
                await stub.Release(pb.ReleaseRequest(request_id=rid))

        warm = max(p.concurrency, p.admissions // 10)
        await asyncio.gather(*(client(warm // p.concurrency) for _ in range(p.concurrency)))
        latencies.clear()
        per = max(1, p.admissions // p.concurrency)
        t0 = time.perf_counter()
        await asyncio.gather(*(client(per) for _ in range(p.concurrency)))
        wall = time.perf_counter() - t0
        state = await stub.GetState(pb.GetStateRequest())
        for w in workers:
            await w.stop()
    return {
        "workers": n_workers, "admissions": per * p.concurrency,
        "concurrency": p.concurrency, "admissions_per_s": per * p.concurrency / wall,
        "admit_p50_ms": _percentile(latencies, 0.50) * 1e3,
        "admit_p99_ms": _percentile(latencies, 0.99) * 1e3,
        "reclaimed_pages": sum(w.reclaimed_pages_total for w in state.workers),
        "populated_pages": sum(w.populated_pages_total for w in state.workers),
    }


def _core_rate(n_workers: int, admissions: int) -> dict[str, float]:
    """The same workload through :class:`ResidencyCore` in-process (what the engine pays
    per admission without gRPC): admit + release, commands acknowledged at once."""
    from services.residency.core import AdmitSpec, ResidencyCore, WorkerSpec

    core = ResidencyCore()
    for i in range(n_workers):
        core.register_worker(WorkerSpec(f"w{i:03d}", CAPACITY_PAGES, 16, 64))
    samples, live = [], []
    t_start = time.perf_counter()
    for i in range(admissions):
        t0 = time.perf_counter()
        ticket = core.admit(AdmitSpec(f"r{i}", REQUIRED_PAGES, HISTORY_PAGES))
        samples.append(time.perf_counter() - t0)
        for wid in core.workers:
            for cmd in core.take_commands(wid):
                core.ack(cmd.command_id)
        live.append(ticket.spec.request_id)
        if len(live) >= 32:                    # keep 32 requests resident, like the RPC run
            core.release(live.pop(0))
    wall = time.perf_counter() - t_start
    return {"core_admissions_per_s": admissions / wall,
            "core_admit_p50_us": _percentile(samples, 0.5) * 1e6,
            "core_admit_p99_us": _percentile(samples, 0.99) * 1e6}


def run(params: BenchParams) -> dict[str, Any]:
    results = []
    for n in params.workers:
        with _Controller() as port:
            results.append(asyncio.run(_one_size(port, n, params)))
        results[-1].update(_core_rate(n, max(params.admissions, 10_000)))
    return {"bench": "residency", "git_sha": _git_sha(), "host": platform.node(),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "grpc": grpc.__version__, "params": asdict(params), "results": results}


def run_and_report(params: BenchParams, output: str | None) -> dict[str, Any]:
    from rich.console import Console
    from rich.table import Table

    report = run(params)
    table = Table(title=f"residency admissions over loopback (git {report['git_sha']}, "
                        f"{params.concurrency} in flight)")
    for col in ("workers", "RPC adm/s", "Admit p50 ms", "Admit p99 ms", "core adm/s",
                "core p50 µs", "core p99 µs"):
        table.add_column(col, justify="right")
    for r in report["results"]:
        table.add_row(str(r["workers"]), f"{r['admissions_per_s']:.0f}",
                      f"{r['admit_p50_ms']:.2f}", f"{r['admit_p99_ms']:.2f}",
                      f"{r['core_admissions_per_s']:.0f}", f"{r['core_admit_p50_us']:.1f}",
                      f"{r['core_admit_p99_us']:.1f}")
    Console().print(table)
    text = json.dumps(report, indent=2)
    if output:
        Path(output).write_text(text + "\n")
    else:
        print(text)
    return report
