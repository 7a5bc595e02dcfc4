"""Rounds over the hierarchy: one resolve per source group per round, padding queries
resolve nothing, the shared staging arena is reused group after group, bad input."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import InvalidArgument, NotFound, ResourceExhausted
from services.decode.engine.config import EngineConfig
from services.decode.engine.engine import Engine
from services.decode.engine.request import GenerateSpec
from services.decode.hierarchy import apply_copies, release_staging, resolve
from tests.engine.harness import check_engine, pressured, prompts, serve


def test_one_resolve_per_group_per_round() -> None:
    engine = Engine(pressured("adaptive-spec", "glm", pages=400))
    engine.submit(GenerateSpec("full", 12, prompt=prompts(1)[0], spec_block=4))
    engine.submit(GenerateSpec("single", 12, prompt=prompts(2)[1], spec_block=1))
    engine.step()  # admission + first round
    groups = list(engine.hierarchy.groups.values())
    for _ in range(3):
        clocks = [g.clock for g in groups]
        rounds = engine.stats.rounds
        engine.step()
        assert engine.stats.rounds == rounds + 2  # both requests ran a round ...
        assert [g.clock for g in groups] == [c + 1 for c in clocks]  # ... in one resolve
        check_engine(engine)


def test_padding_costs_nothing_exactly() -> None:
    """Selected-row counts equal the valid queries' min(k, visible) selections exactly."""
    engine = Engine(pressured("adaptive-spec", "glm", pages=400))
    engine.submit(GenerateSpec("a", 12, prompt=prompts(1)[0], spec_block=1))
    engine.submit(GenerateSpec("b", 12, prompt=prompts(2)[1], spec_block=1))
    engine.step()
    k, groups = engine.config.model.top_k, len(engine.hierarchy.groups)
    for _ in range(3):
        before = engine.kv.counts.selected
        expected = sum(min(k, r.committed) for r in engine.running.values()) * groups
        engine.step()
        # K_max = 4 columns per request, but only the anchor is valid (spec_block = 1)
        assert engine.kv.counts.selected - before == expected


def test_shared_staging_arena_is_reused_across_groups() -> None:
    cfg = pressured("hisparse", "glm", pages=400, spec_block=4)
    engine = Engine(cfg)
    assert engine.hierarchy.shared_staging
    arenas = {id(g.staging.arena) for g in engine.hierarchy.groups.values()}
    assert len(arenas) == 1  # one arena for every group: M_stage = N·K_max·k rows
    arena = next(iter(engine.hierarchy.groups.values())).staging.arena
    assert arena.capacity == cfg.max_requests * cfg.k_max * cfg.model.top_k
    for i, p in enumerate(prompts(3)):
        engine.submit(GenerateSpec(f"r{i}", 10, prompt=p))
    while not engine.idle:
        engine.step()
        assert not arena.staged  # every group's staged rows released after its readers
        check_engine(engine)
    assert engine.stats.counts.staged_rows > 0  # B = 2 < k: the arena was used


def test_staging_of_an_earlier_group_blocks_a_later_group_until_released() -> None:
    cfg = pressured("hisparse", "glm", pages=400, max_requests=1, spec_block=1)
    engine = Engine(cfg)
    engine.submit(GenerateSpec("r0", 4, prompt=prompts(1)[0]))
    engine.step()
    g0, g1 = engine.hierarchy.groups.values()
    k = cfg.model.top_k
    sel = torch.arange(k, dtype=torch.int64).view(1, 1, k)
    vis = torch.tensor([[40]])
    plan = resolve(g0, ["r0"], sel, vis)  # g0 stages k - B rows: its readers are still running
    staged = len(g0.staging.staged)
    assert staged > 0 and len(g0.staging.free_locs) == cfg.staging_rows - staged
    with pytest.raises(ResourceExhausted, match="staging"):  # g1 cannot take g0's rows
        resolve(g1, ["r0"], sel + 8, vis)
    assert len(g1.staging.staged) == 0
    for layer in range(g0.spec.payload_layers):
        apply_copies(g0, plan, layer)
    g0.readers_finished(plan.epoch)
    release_staging(g0)  # g0's readers finished: the arena is free for g1
    resolve(g1, ["r0"], sel + 8, vis)
    assert len(g1.staging.staged) == staged


def test_bad_requests_are_refused_and_change_nothing() -> None:
    engine = Engine(pressured("adaptive-spec", "glm"))
    cases = [
        (GenerateSpec("x", 8, prefix_id="nope"), NotFound, "prefix_id='nope'"),
        (GenerateSpec("x", 8, prompt=[1, 2], spec_block=9), InvalidArgument, "K_max=4"),
        (GenerateSpec("x", 500, prompt=[1, 2]), InvalidArgument, "max_context=128"),
        (GenerateSpec("x", 8, prompt=[1, 999]), InvalidArgument, r"prompt\[1\]=999: .* 0..63"),
    ]
    for spec, exc, fragment in cases:
        with pytest.raises(exc, match=fragment.replace("(", r"\(")):
            engine.submit(spec)
    assert engine.idle and not engine.waiting
    with pytest.raises(InvalidArgument, match="prompt is empty"):
        GenerateSpec("x", 8, prompt=[])
    with pytest.raises(InvalidArgument, match="max_new_tokens=0"):
        GenerateSpec("x", 0, prompt=[1])
    engine.submit(GenerateSpec("ok", 4, prompt=[1, 2, 3]))
    with pytest.raises(InvalidArgument, match="already in flight"):
        engine.submit(GenerateSpec("ok", 4, prompt=[1, 2, 3]))
    assert len(engine.waiting) == 1


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(policy="lru"), "--policy='lru'"),
    (dict(topology="ring"), "--topology='ring'"),
    (dict(hot_cache=0), "--hot-cache=0"),
    (dict(kv_memory="1KiB"), "--kv-memory=1KiB"),
    (dict(kv_memory="lots"), "--kv-memory='lots'"),
    (dict(spec_block=0), "--spec-block=0"),
    (dict(top_k=-1), "--top-k=-1"),
    (dict(draft_layers=9), "--draft-layers=9"),
])
def test_bad_config_names_the_option(kwargs, fragment) -> None:
    with pytest.raises(InvalidArgument) as info:
        EngineConfig(**{"preset": "tiny", **kwargs})
    assert fragment in str(info.value)


@pytest.mark.parametrize("topology", ["glm", "deepseek"])
def test_speculative_memory_matches_the_formulas(topology) -> None:
    cfg = pressured("adaptive-spec", topology, pages=400, draft_window=16)
    engine = Engine(cfg)
    mem = engine.spec_memory()
    ring, staging = engine.allocated_spec_bytes()
    assert mem.ring_rows == cfg.page_rows * -(-(16 + cfg.page_rows - 1 + 4) // cfg.page_rows)
    assert ring == mem.ring_bytes  # eq. 9: N · R_d · d_draft, whatever the context
    assert staging == mem.staging_bytes  # χ · N · K_max · k · d_KV, one arena for all groups
    longer = Engine(pressured("adaptive-spec", topology, pages=400, draft_window=16,
                              max_context=1024))
    assert longer.allocated_spec_bytes() == (ring, staging)  # independent of context
    assert Engine(pressured("adaptive", topology, pages=400)).spec_memory() is None


def test_rejected_rows_are_rolled_back_everywhere() -> None:
    """After every speculative round: tail, index keys and draft ring end at n' (eq. 7);
    rejected rows are neither committed nor backed up (I5)."""
    engine = Engine(pressured("adaptive-spec", "glm", pages=400))
    for i, p in enumerate(prompts(3)):
        engine.submit(GenerateSpec(f"r{i}", 20, prompt=p))
    while not engine.idle:
        engine.step()
        for run in engine.running.values():
            n = run.committed
            for group in engine.hierarchy.groups.values():
                state = group.request(run.request_id)
                assert state.committed == state.tail_hi == n
                for backing in state.backings:
                    assert not bool(backing.backed_mask()[n:].any())
            for g in range(engine.config.model.groups):
                assert engine.index.length(run.slot, g) == n
            assert engine.drafter.frontier(run.slot) <= n
        check_engine(engine)
    assert engine.stats.round_queries > engine.stats.round_tokens  # some drafts rejected


def test_a_request_that_can_never_fit_is_refused_at_submit() -> None:
    cfg = pressured("resident", "glm", pages=12)
    engine = Engine(cfg)
    with pytest.raises(InvalidArgument, match=r"needs \d+ pages .* at most 12 pages"):
        engine.submit(GenerateSpec("big", 60, prompt=prompts(1)[0]))
    assert engine.idle


def test_counters_and_settings_reach_the_core() -> None:
    engine = serve(pressured("hisparse", "glm", pages=400), n=2, max_new=6, check=False)
    c = engine.stats.counts
    row_bytes = engine.config.model.row_bytes
    assert c.host_rows > 0 and c.host_bytes == c.host_rows * row_bytes * 2  # 2 payloads
    assert engine.stats.coverage_mean == 0.0  # hisparse keeps no optional history
    adaptive = Engine(pressured("adaptive", "glm", populate_pages=3))
    assert adaptive.admission.core.config.populate_pages == 3


def test_commands_for_requests_this_worker_does_not_hold_are_refused_not_fatal() -> None:
    """A remote controller's command can race its request (grant not yet here, or the
    request already finished): it is acknowledged ok=False and decoding goes on."""
    from services.residency.core import Command, CommandKind

    class Racy:
        """LocalAdmission that also delivers commands for unknown requests."""

        def __init__(self, inner) -> None:
            self.inner, self.refused, self.extra = inner, [], [
                Command(900_001, CommandKind.POPULATE, inner.worker_id, "gone", 2),
                Command(900_002, CommandKind.BACKUP, inner.worker_id, "not-yet", 0)]

        def take_commands(self):
            extra, self.extra = self.extra, []
            return self.inner.take_commands() + extra

        def ack(self, cmd, ok=True):
            if cmd.command_id >= 900_000:
                self.refused.append((cmd.command_id, ok))
            else:
                self.inner.ack(cmd, ok)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    engine = Engine(pressured("adaptive", "glm", pages=400))
    engine.admission = Racy(engine.admission)
    engine.submit(GenerateSpec("r0", 6, prompt=prompts(1)[0]))
    engine.run_until_idle()
    assert engine.admission.refused == [(900_001, False), (900_002, False)]
    assert len(engine.finished[0].output) == 6
