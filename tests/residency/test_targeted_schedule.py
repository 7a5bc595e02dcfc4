"""Scheduling only the workers an event changed issues exactly the commands a full scan
of every worker issues (same kinds, requests, pages, order) on random workloads."""

from __future__ import annotations

import random

import pytest

from services.residency.core import AdmitSpec, PolicyConfig, PolicyKind, ResidencyCore, WorkerSpec
from services.residency.core.invariants import check_all


class FullScan(ResidencyCore):
    """The reference behaviour: every event rescans every worker."""

    def _schedule(self, touched: str | None = None) -> None:
        super()._schedule(None)


def drive(core: ResidencyCore, seed: int, workers: int = 4, steps: int = 300) -> list[tuple]:
    rng = random.Random(seed)
    for i in range(workers):
        core.register_worker(WorkerSpec(f"w{i}", capacity_pages=60, reserve_pages=4))
    log: list[tuple] = []
    live: list[str] = []
    for step in range(steps):
        op = rng.random()
        if op < 0.45:
            rid = f"r{step}"
            pinned = rng.choice(["", f"w{rng.randrange(workers)}"])
            core.admit(AdmitSpec(rid, rng.randint(1, 8), rng.randint(0, 30), pinned))
            live.append(rid)
        elif op < 0.75 and live:
            rid = live.pop(rng.randrange(len(live)))
            if rid in core.requests:
                core.release(rid)
            elif rid in {t.spec.request_id for t in core.waiting}:
                ticket = next(t for t in core.waiting if t.spec.request_id == rid)
                core.cancel(ticket)
        for i in range(workers):
            for cmd in core.take_commands(f"w{i}"):
                log.append((cmd.kind.value, cmd.worker_id, cmd.request_id, cmd.pages))
                if rng.random() < 0.9:
                    core.ack(cmd.command_id, cmd.worker_id)
                else:  # acknowledged later, after other events
                    live.append(f"ack:{cmd.command_id}:{cmd.worker_id}")
        for item in [x for x in live if x.startswith("ack:") and rng.random() < 0.5]:
            live.remove(item)
            _, cid, wid = item.split(":")
            if int(cid) in core.commands:
                core.ack(int(cid), wid)
        check_all(core)
    return log


@pytest.mark.parametrize("policy", [PolicyKind.WHOLE_REQUEST, PolicyKind.ELASTIC])
@pytest.mark.parametrize("seed", range(6))
def test_targeted_schedule_equals_full_scan(policy, seed) -> None:
    cfg = PolicyConfig(policy=policy, populate_pages=4, populate_inflight=2)
    targeted = drive(ResidencyCore(cfg, clock=lambda: 0.0), seed)
    full = drive(FullScan(cfg, clock=lambda: 0.0), seed)
    assert targeted == full
    assert any(kind == "populate" for kind, *_ in full)  # the scenario exercises populate
