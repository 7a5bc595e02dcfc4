"""Service tests over real gRPC on port 0 (in-process grpc.aio server)."""

from __future__ import annotations

import asyncio
import urllib.request

import grpc
import pytest

from services.common.gen.dhisparse.v1 import residency_pb2 as pb
from services.residency.core.invariants import check_all
from services.residency.simworker import SimulatedWorker
from tests.residency.harness import Served, hello, serving


def run(coro) -> None:
    asyncio.run(asyncio.wait_for(coro, 60))


async def _filled(s: Served) -> None:
    """w0: M=100, M_res=10, a 90-page request 'big' (no history): nothing free."""
    await s.stub.RegisterWorker(hello())
    await s.stub.Admit(pb.AdmitRequest(request_id="big", required_pages=90))


def test_granted_admission_reports_placement_and_history() -> None:
    async def body() -> None:
        async with serving() as s:
            reg = await s.stub.RegisterWorker(hello())
            assert reg.epoch == s.controller.epoch and reg.heartbeat_timeout_s == 30.0
            g = await s.stub.Admit(pb.AdmitRequest(request_id="r1", required_pages=10,
                                                   history_pages=50))
            assert (g.worker_id, g.worker_address, g.required_pages, g.optional_pages) == \
                ("w0", "w0:1", 10, 50)
            st = await s.state()
            [w] = st.workers
            assert (w.required_pages, w.optional_pages, w.free_pages, w.allocated_slots) == \
                (10, 50, 30, 1)
            assert [r.request_id for r in w.requests] == ["r1"] and not w.alive
    run(body())


def test_waiting_admission_is_served_by_a_release_on_another_channel() -> None:
    async def body() -> None:
        async with serving() as s:
            await _filled(s)
            waiter = asyncio.ensure_future(
                s.stub.Admit(pb.AdmitRequest(request_id="r1", required_pages=30), timeout=10))
            await asyncio.sleep(0.2)
            assert not waiter.done() and (await s.state()).waiting_admissions == 1
            async with s.channel() as other:
                from services.common.gen.dhisparse.v1 import residency_pb2_grpc
                freed = await residency_pb2_grpc.ResidencyStub(other).Release(
                    pb.ReleaseRequest(request_id="big"))
            assert freed.freed_pages == 90
            g = await waiter
            assert g.worker_id == "w0" and g.wait_seconds >= 0.15
            assert (await s.state()).waiting_admissions == 0
    run(body())


def test_deadline_exceeded_leaves_nothing_held() -> None:
    async def body() -> None:
        async with serving() as s:
            await _filled(s)
            before = await s.state()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await s.stub.Admit(pb.AdmitRequest(request_id="r1", required_pages=30),
                                   timeout=0.3)
            assert err.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            await asyncio.sleep(0.05)
            after = await s.state()
            assert after.waiting_admissions == 0
            assert [w.free_pages for w in after.workers] == [w.free_pages for w in before.workers]
            # The id is free again: a later admission with it succeeds once pages are free.
            await s.stub.Release(pb.ReleaseRequest(request_id="big"))
            await s.stub.Admit(pb.AdmitRequest(request_id="r1", required_pages=30), timeout=2)
    run(body())


def test_cancelled_admission_is_withdrawn() -> None:
    async def body() -> None:
        async with serving() as s:
            await _filled(s)
            call = s.stub.Admit(pb.AdmitRequest(request_id="r1", required_pages=30))
            await asyncio.sleep(0.2)
            assert (await s.state()).waiting_admissions == 1
            call.cancel()
            for _ in range(50):
                if (await s.state()).waiting_admissions == 0:
                    break
                await asyncio.sleep(0.02)
            assert (await s.state()).waiting_admissions == 0
            assert "r1" not in s.controller.core.requests
    run(body())


async def _pressure(s):
    """Request "a" keeps 80 optional pages; "b" then needs 20: the controller reclaims "a".
    Returns the manual-ack worker, the waiting Admit of "b" and the Backup command."""
    worker = SimulatedWorker(s.stub, hello(), auto_ack=False)
    await worker.start()
    await s.stub.Admit(pb.AdmitRequest(request_id="a", required_pages=10, history_pages=80))
    waiter = asyncio.ensure_future(
        s.stub.Admit(pb.AdmitRequest(request_id="b", required_pages=20), timeout=10))
    [backup] = await worker.wait_for_commands(1)
    return worker, waiter, backup


def test_reclaim_runs_backup_then_retire_over_the_session() -> None:
    async def body() -> None:
        async with serving() as s:
            worker, waiter, backup = await _pressure(s)
            assert backup.WhichOneof("kind") == "backup" and backup.request_id == "a"
            assert backup.backup.pages == 80
            worker.ack(backup.command_id)
            [_, retire] = await worker.wait_for_commands(2)
            assert retire.WhichOneof("kind") == "retire" and retire.retire.pages == 80
            assert not waiter.done()
            worker.ack(retire.command_id)
            g = await waiter
            assert list(g.reclaimed_requests) == ["a"] and g.optional_pages == 0
            st = await s.state()
            assert st.workers[0].alive and st.workers[0].reclaimed_pages_total == 80
            check_all(s.controller.core)
            await worker.stop()
    run(body())


def test_dead_worker_is_dropped_and_its_ledger_freed() -> None:
    async def body() -> None:
        async with serving(heartbeat_timeout_seconds=0.4) as s:
            worker = SimulatedWorker(s.stub, hello(), heartbeat_s=0.1)
            await worker.start()
            await s.stub.Admit(pb.AdmitRequest(request_id="a", required_pages=10))
            await asyncio.sleep(0.6)               # heartbeats keep it alive
            assert [w.worker_id for w in (await s.state()).workers] == ["w0"]
            await worker.stop(abrupt=True)         # the worker dies silently
            await asyncio.sleep(0.8)
            st = await s.state()
            assert list(st.workers) == [] and s.controller.core.requests == {}
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await s.stub.Release(pb.ReleaseRequest(request_id="a"))
            assert err.value.code() is grpc.StatusCode.NOT_FOUND
    run(body())


def test_metrics_are_served_over_http() -> None:
    async def body() -> None:
        async with serving(metrics_port=0) as s:
            await s.stub.RegisterWorker(hello())
            await s.stub.Admit(pb.AdmitRequest(request_id="a", required_pages=10,
                                               history_pages=20))
            await asyncio.sleep(0.15)              # one tick publishes the gauges
            url = f"http://127.0.0.1:{s.metrics.port}/metrics"
            text = await asyncio.to_thread(lambda: urllib.request.urlopen(url).read().decode())
            for line in ('dhisparse_pages{kind="required",worker="w0"} 10.0',
                         'dhisparse_pages{kind="optional",worker="w0"} 20.0',
                         'dhisparse_pages{kind="free",worker="w0"} 60.0',
                         'dhisparse_pages{kind="reserve",worker="w0"} 10.0',
                         'dhisparse_request_slots{state="allocated",worker="w0"} 1.0',
                         'dhisparse_request_slots{state="capacity",worker="w0"} 8.0',
                         'dhisparse_history_coverage_ratio{worker="w0"} 1.0',
                         'dhisparse_admission_wait_seconds_count{worker="w0"} 1.0'):
                assert line in text, line
            assert "dhisparse_reclaimed_pages_total" in text or "# TYPE dhisparse_reclaimed" in text
            assert 'request' not in text.replace("request_slots", "")
    run(body())


@pytest.mark.parametrize(("call", "code", "match"), [
    (lambda st: st.Admit(pb.AdmitRequest(request_id="x", required_pages=-1)),
     grpc.StatusCode.INVALID_ARGUMENT, "required_pages=-1"),
    (lambda st: st.Admit(pb.AdmitRequest(request_id="x", required_pages=91)),
     grpc.StatusCode.INVALID_ARGUMENT, "91 exceeds"),
    (lambda st: st.Admit(pb.AdmitRequest(request_id="", required_pages=1)),
     grpc.StatusCode.INVALID_ARGUMENT, "request_id"),
    (lambda st: st.Admit(pb.AdmitRequest(request_id="x", required_pages=1, worker_id="nope")),
     grpc.StatusCode.NOT_FOUND, "nope"),
    (lambda st: st.Admit(pb.AdmitRequest(request_id="a", required_pages=1)),
     grpc.StatusCode.ALREADY_EXISTS, "'a'"),
    (lambda st: st.Release(pb.ReleaseRequest(request_id="nope")),
     grpc.StatusCode.NOT_FOUND, "nope"),
    (lambda st: st.Release(pb.ReleaseRequest(request_id="a", worker_id="w9")),
     grpc.StatusCode.FAILED_PRECONDITION, "not w9"),
    (lambda st: st.RegisterWorker(hello(capacity=99)),
     grpc.StatusCode.ALREADY_EXISTS, "capacity_pages"),
    (lambda st: st.RegisterWorker(hello("w1", capacity=-4)),
     grpc.StatusCode.INVALID_ARGUMENT, "capacity_pages=-4"),
    (lambda st: st.RegisterWorker(hello("w1", requests=(pb.RequestPages(
        request_id="q", required_pages=5, history_pages=10, ready_pages=2, backed_pages=3),))),
     grpc.StatusCode.INVALID_ARGUMENT, "neither on the device nor backed"),
    (lambda st: st.GetState(pb.GetStateRequest(worker_id="nope")),
     grpc.StatusCode.NOT_FOUND, "nope"),
])
def test_bad_input_gets_its_status_and_changes_nothing(call, code, match) -> None:
    async def body() -> None:
        async with serving() as s:
            await s.stub.RegisterWorker(hello())
            await s.stub.Admit(pb.AdmitRequest(request_id="a", required_pages=10,
                                               history_pages=5))
            before = await s.ledger()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call(s.stub)
            assert err.value.code() is code and match in err.value.details()
            assert await s.ledger() == before
    run(body())


def test_session_ack_twice_is_failed_precondition_and_ledger_unchanged() -> None:
    async def body() -> None:
        async with serving() as s:
            worker, waiter, backup = await _pressure(s)
            worker.ack(backup.command_id)
            await worker.wait_for_commands(2)
            before = await s.ledger()
            worker.ack(backup.command_id)          # again
            await worker.wait_for_commands(3, timeout=5)
            assert worker.error is not None
            assert worker.error.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert "acknowledged already" in worker.error.details()
            assert await s.ledger() == before
            # Reconnecting re-sends the unacknowledged Retire; acking it serves "b".
            again = SimulatedWorker(s.stub, hello())
            await again.start()
            g = await waiter
            assert list(g.reclaimed_requests) == ["a"]
            assert [c.WhichOneof("kind") for c in again.received] == ["retire"]
            await again.stop()
    run(body())
