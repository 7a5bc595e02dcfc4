"""Shared engine fixtures: a pressured tiny configuration and an invariant-checking driver."""

from __future__ import annotations

import torch

from services.decode.engine.config import EngineConfig
from services.decode.engine.engine import Engine
from services.decode.engine.request import GenerateSpec
from services.decode.hierarchy import invariants as hinv
from services.decode.hierarchy.pages import optional_pages
from services.residency.core.invariants import check_all

POLICIES = ("resident", "hisparse", "adaptive", "resident-spec", "adaptive-spec")


def pressured(policy: str, topology: str, pages: int = 32, **kw) -> EngineConfig:
    """Tiny model, B = 2 rows (k = 8: host misses every step), a budget of ``pages``
    ledger pages: resident histories stop fitting and adaptive must reclaim."""
    probe = EngineConfig(policy=policy, preset="tiny", topology=topology, page_rows=8,
                         kv_memory=1 << 20, max_context=128)
    args = dict(policy=policy, preset="tiny", topology=topology, page_rows=8,
                kv_memory=probe.page_bytes * pages, hot_cache=2, max_requests=6,
                max_context=128, batch_invariant=True, spec_block=4)
    args.update(kw)
    return EngineConfig(**args)


def prompts(n: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 64, (48 + 8 * (i % 3),), generator=g).tolist() for i in range(n)]


def check_engine(engine: Engine) -> None:
    """Every hierarchy invariant that needs no reference copy, the ledger's invariants,
    and agreement between the ledger and the device pools (I2, I6)."""
    for group in engine.hierarchy.groups.values():
        hinv.assert_recoverable(group)
        hinv.assert_capacity(group)
        hinv.assert_ordering(group)
        hinv.assert_no_leak(group)
    core = engine.admission.core
    check_all(core)
    ledger = core.workers[engine.admission.worker_id]
    deferred = {c.request_id: c.pages for c in engine.deferred_populates}
    for rid in engine.running:
        entry = core.requests[rid]
        for group in engine.hierarchy.groups.values():  # a paced Populate is reserved only
            assert optional_pages(group, rid) == entry.allocated - deferred.get(rid, 0), (
                rid, entry)
    for group in engine.hierarchy.groups.values():
        used = group.pages.count("required") + group.pages.count("optional")
        assert used <= ledger.spec.capacity_pages - ledger.spec.reserve_pages


def serve(config: EngineConfig, n: int = 10, max_new: int = 24, check: bool = True,
          seed: int = 1) -> Engine:
    engine = Engine(config)
    for i, prompt in enumerate(prompts(n, seed)):
        engine.submit(GenerateSpec(f"r{i}", max_new, prompt=prompt))
    while not engine.idle:
        engine.step()
        if check:
            check_engine(engine)
    return engine


def outputs(engine: Engine) -> dict[str, list[int]]:
    return {r.request_id: r.output for r in engine.finished}
