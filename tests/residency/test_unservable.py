"""Admissions no registered worker can ever serve fail instead of blocking the FIFO queue:
one pinned to a worker that is dropped, one queued before any worker registered that needs
more pages than the pool that then registers."""

from __future__ import annotations

import asyncio

import pytest

from services.common.errors import InvalidArgument, Unavailable
from services.residency.config import ResidencyConfig
from services.residency.controller import ResidencyController
from services.residency.core import (
    AdmitSpec,
    PolicyConfig,
    RequestReport,
    ResidencyCore,
    TicketState,
    WorkerSpec,
)
from services.residency.core.invariants import check_all

NO_POPULATE = dict(populate_inflight=0, trace_limit=10_000)


def test_admission_pinned_to_a_dropped_worker_fails_and_the_queue_moves() -> None:
    resolved = []
    core = ResidencyCore(PolicyConfig(**NO_POPULATE), on_resolved=resolved.append)
    core.register_worker(WorkerSpec("w1", 100, 10), [RequestReport("big", 90, 0, 0, 0)])
    core.register_worker(WorkerSpec("w2", 100, 10))
    pinned = core.admit(AdmitSpec("b", 10, worker_id="w1"))  # w1 is full: waits
    later = core.admit(AdmitSpec("c", 10))  # behind b in FIFO order
    assert pinned.state is TicketState.WAITING and later.state is TicketState.WAITING
    core.remove_worker("w1")
    assert pinned.state is TicketState.FAILED and isinstance(pinned.failure, Unavailable)
    assert "pinned worker w1 is gone" in str(pinned.failure)
    assert later.state is TicketState.GRANTED and later.grant.worker_id == "w2"
    assert pinned in resolved and "b" not in [t.spec.request_id for t in core.waiting]
    check_all(core)


def test_admission_larger_than_the_pool_that_registers_fails() -> None:
    core = ResidencyCore(PolicyConfig(**NO_POPULATE))
    huge = core.admit(AdmitSpec("huge", 1000))  # no worker yet: waits
    small = core.admit(AdmitSpec("small", 1))
    assert huge.state is TicketState.WAITING
    core.register_worker(WorkerSpec("w0", 100, 10))
    assert huge.state is TicketState.FAILED and isinstance(huge.failure, InvalidArgument)
    assert "required_pages=1000 exceeds the largest admittable pool" in str(huge.failure)
    assert small.state is TicketState.GRANTED
    check_all(core)


def test_the_waiting_caller_gets_the_failure() -> None:
    async def body() -> None:
        c = ResidencyController(ResidencyConfig(port=0, populate_inflight=0))
        waiting = asyncio.ensure_future(c.admit(AdmitSpec("huge", 1000), timeout=10))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        c.register(WorkerSpec("w0", 100, 10))
        with pytest.raises(InvalidArgument, match="required_pages=1000"):
            await asyncio.wait_for(waiting, 5)
        assert not c.core.waiting
    asyncio.run(body())
