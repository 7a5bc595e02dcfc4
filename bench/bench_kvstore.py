"""``dhisparse bench kvstore``: the kvstore's data paths against their ceilings.

* mapped client write/read GB/s (``torch`` copy into/out of the shared mapping) against
  a plain ``torch`` memcpy of the same size, measured in the same run;
* gRPC ``WriteRows``/``ReadRows`` MB/s over loopback (remote peers, prefill handoff);
* ``OpenHistory`` and ``CommitRows`` latency p50/p99 (commit includes the manifest fsync).

Starts its own store process (``python -m services.kvstore``) with a private prefix and
removes its segments afterwards. Median of ``repeats`` after one warm-up.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class BenchParams:
    row_bytes: int = 4096
    rows: int = 65536
    repeats: int = 5
    grpc_mib: int = 256
    latency_ops: int = 500


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: page-table population, allocator
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _percentiles(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"p50_us": s[len(s) // 2] * 1e6, "p99_us": s[min(len(s) - 1, int(len(s) * 0.99))] * 1e6}


class _Store:
    """A private kvstore process for the benchmark."""

    def __init__(self, capacity: int) -> None:
        self.prefix = f"bench-{os.getpid()}"
        self.dir = Path(tempfile.mkdtemp(prefix="kvbench-"))
        port_file = self.dir / "port"
        env = {k: v for k, v in os.environ.items() if not k.startswith("DHISPARSE_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.kvstore", "--port", "0", "--port-file",
             str(port_file), "--prefix", self.prefix, "--capacity", str(capacity),
             "--log-level", "WARNING"], cwd=REPO, env=env)
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("kvstore did not start")
            time.sleep(0.02)
        self.target = f"127.0.0.1:{int(port_file.read_text())}"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        for p in Path("/dev/shm").glob(f"{self.prefix}-*"):
            p.unlink(missing_ok=True)
        shutil.rmtree(Path("/dev/shm") / f"{self.prefix}.manifest", ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def _mapped(client: Any, p: BenchParams) -> dict[str, float]:
    nbytes = p.rows * p.row_bytes
    h = client.open("bench-mapped", 0, p.row_bytes, p.rows)
    src = torch.randint(0, 256, (p.rows, p.row_bytes), dtype=torch.uint8)
    dst = torch.empty_like(src)
    rows = h.rows()
    t_memcpy = _median_seconds(lambda: dst.copy_(src), p.repeats)
    t_write = _median_seconds(lambda: rows.copy_(src), p.repeats)
    t_read = _median_seconds(lambda: dst.copy_(rows), p.repeats)
    assert torch.equal(dst, src), "mapped read-back differs"
    client.close("bench-mapped", 0)
    gbs = {k: nbytes / t / 1e9 for k, t in
           (("memcpy", t_memcpy), ("write", t_write), ("read", t_read))}
    return {"bytes": nbytes, "memcpy_gbs": gbs["memcpy"], "write_gbs": gbs["write"],
            "read_gbs": gbs["read"], "write_vs_memcpy": gbs["write"] / gbs["memcpy"],
            "read_vs_memcpy": gbs["read"] / gbs["memcpy"]}


def _grpc(rpc: Any, p: BenchParams) -> dict[str, float]:
    rows = max(1, (p.grpc_mib << 20) // p.row_bytes)
    nbytes = rows * p.row_bytes
    rpc.open("bench-grpc", 0, "bench", p.row_bytes, rows)
    data = os.urandom(nbytes)
    t_write = _median_seconds(
        lambda: rpc.write_rows("bench-grpc", 0, "bench", 0, data, p.row_bytes), p.repeats)
    got: list[bytes] = []
    t_read = _median_seconds(lambda: got.append(rpc.read_rows("bench-grpc", 0, 0, rows)),
                             p.repeats)
    assert got[-1] == data, "gRPC read-back differs"
    rpc.close("bench-grpc", 0, "bench")
    return {"bytes": nbytes, "write_mbs": nbytes / t_write / 1e6,
            "read_mbs": nbytes / t_read / 1e6}


def _latency(rpc: Any, p: BenchParams) -> dict[str, dict[str, float]]:
    opens, commits = [], []
    for i in range(p.latency_ops):
        t0 = time.perf_counter()
        rpc.open(f"bench-lat-{i}", 0, "bench", p.row_bytes, 16)
        opens.append(time.perf_counter() - t0)
    rpc.open("bench-commit", 0, "bench", p.row_bytes, p.latency_ops)
    for i in range(p.latency_ops):
        t0 = time.perf_counter()
        rpc.commit("bench-commit", 0, "bench", [(i, i + 1)])
        commits.append(time.perf_counter() - t0)
    for i in range(p.latency_ops):
        rpc.close(f"bench-lat-{i}", 0, "bench")
    rpc.close("bench-commit", 0, "bench")
    return {"open_history": _percentiles(opens), "commit_rows": _percentiles(commits)}


def run(p: BenchParams) -> dict[str, Any]:
    """Run every measurement; returns the JSON-able report."""
    from services.kvstore.client import KVStoreClient

    payload = p.rows * p.row_bytes
    store = _Store(capacity=payload + (p.grpc_mib << 20) + (p.latency_ops + 1) * p.row_bytes
                   * 16 + (256 << 20))
    try:
        with KVStoreClient(store.target, "bench", register_cuda=False, renew=False) as client:
            report = {"params": asdict(p), "mapped": _mapped(client, p),
                      "grpc": _grpc(client.rpc, p), "latency": _latency(client.rpc, p)}
    finally:
        store.close()
    report["env"] = _environment()
    return report


def _environment() -> dict[str, Any]:
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                         capture_output=True).stdout.strip()
    return {"git_sha": sha, "host": platform.node(), "cpu": platform.processor() or
            platform.machine(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version()}


def run_and_report(p: BenchParams, output: str | None) -> dict[str, Any]:
    """Run, print a rich table, write JSON to ``output`` (or stdout when None)."""
    from rich.console import Console
    from rich.table import Table

    report = run(p)
    m, g, lat = report["mapped"], report["grpc"], report["latency"]
    table = Table(title=f"kvstore bench ({m['bytes'] >> 20} MiB mapped, "
                        f"{g['bytes'] >> 20} MiB gRPC, row {p.row_bytes} B)")
    for col in ("path", "figure", "vs ceiling"):
        table.add_column(col)
    table.add_row("memcpy (ceiling)", f"{m['memcpy_gbs']:.2f} GB/s", "1.00")
    table.add_row("mapped write", f"{m['write_gbs']:.2f} GB/s", f"{m['write_vs_memcpy']:.2f}")
    table.add_row("mapped read", f"{m['read_gbs']:.2f} GB/s", f"{m['read_vs_memcpy']:.2f}")
    table.add_row("gRPC WriteRows", f"{g['write_mbs']:.0f} MB/s", "")
    table.add_row("gRPC ReadRows", f"{g['read_mbs']:.0f} MB/s", "")
    for name, key in (("OpenHistory", "open_history"), ("CommitRows", "commit_rows")):
        table.add_row(name, f"p50 {lat[key]['p50_us']:.0f} µs  p99 {lat[key]['p99_us']:.0f} µs",
                      "")
    Console(stderr=True).print(table)
    text = json.dumps(report, indent=2)
    if output:
        Path(output).write_text(text + "\n")
    else:
        print(text)
    return report
