"""A real controller process: kill it, start a new one, and let the worker's report
rebuild the soft state (DESIGN.md §4: workers keep decoding while it is down)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from services.common.gen.dhisparse.v1 import residency_pb2 as pb
from services.common.gen.dhisparse.v1 import residency_pb2_grpc
from services.residency.simworker import SimulatedWorker
from tests.residency.harness import hello

ROOT = Path(__file__).resolve().parents[2]


def start(tmp: Path, name: str) -> tuple[subprocess.Popen, int]:
    port_file = tmp / f"{name}.port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.residency", "--port", "0", "--port-file",
         str(port_file), "--log-level", "WARNING"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 20
    while not port_file.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "controller did not start"
        time.sleep(0.02)
    return proc, int(port_file.read_text())


@pytest.mark.integration
def test_restart_rebuilds_the_ledger_from_worker_reports(tmp_path: Path) -> None:
    first, port = start(tmp_path, "first")
    try:
        async def before_crash() -> pb.GetStateResponse:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = residency_pb2_grpc.ResidencyStub(ch)
                await stub.RegisterWorker(hello())
                await stub.Admit(pb.AdmitRequest(request_id="a", required_pages=10,
                                                 history_pages=50))
                await stub.Admit(pb.AdmitRequest(request_id="b", required_pages=20,
                                                 history_pages=40))
                return await stub.GetState(pb.GetStateRequest(include_requests=True))
        old = asyncio.run(before_crash())
        first.send_signal(signal.SIGKILL)          # no goodbye, no saved state
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()

    second, port2 = start(tmp_path, "second")
    try:
        async def after_restart() -> None:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port2}") as ch:
                stub = residency_pb2_grpc.ResidencyStub(ch)
                assert list((await stub.GetState(pb.GetStateRequest())).workers) == []
                # The worker reconnects and reports what it holds.
                reports = tuple(pb.RequestPages(
                    request_id=r.request_id, required_pages=r.required_pages,
                    history_pages=r.history_pages, ready_pages=r.ready_pages,
                    backed_pages=r.backed_pages) for r in old.workers[0].requests)
                worker = SimulatedWorker(stub, hello(requests=reports))
                await worker.start()
                await asyncio.sleep(0.2)
                st = await stub.GetState(pb.GetStateRequest(include_requests=True))
                [w] = st.workers
                assert st.epoch != old.epoch and w.alive
                assert [(r.request_id, r.required_pages, r.optional_pages, r.backed_pages)
                        for r in w.requests] == [("a", 10, 50, 0), ("b", 20, 10, 30)]
                assert (w.required_pages, w.optional_pages, w.free_pages) == (30, 60, 0)
                # The rebuilt ledger drives a reclaim: "a" (50 pages) makes room for "c".
                g = await stub.Admit(pb.AdmitRequest(request_id="c", required_pages=40),
                                     timeout=10)
                assert list(g.reclaimed_requests) == ["a"]
                assert [c.WhichOneof("kind") for c in worker.received[:2]] == \
                    ["backup", "retire"]
                await worker.stop()
        asyncio.run(after_restart())
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(15) == 0
