"""The engine's batched host path computes what the per-request reference does:
``open_rows_batch`` = concatenated ``open_rows``, ``Engine.coverage`` = the mean of
``hierarchy.coverage``, and a round reads its results back from the device once."""

from __future__ import annotations

import copy
import sys

import pytest
import torch

from services.common.errors import InvalidArgument, ResourceExhausted
from services.decode.engine.engine import Engine
from services.decode.engine.request import GenerateSpec
from services.decode.hierarchy import coverage, open_rows
from services.decode.hierarchy.pages import open_rows_batch
from tests.engine.harness import pressured, prompts


def _running(policy: str, n: int = 4) -> Engine:
    engine = Engine(pressured(policy, "glm", pages=400))
    for i, prompt in enumerate(prompts(n)):
        engine.submit(GenerateSpec(f"r{i}", 12, prompt=prompt))
    for _ in range(3):
        engine.step()
    assert len(engine.running) == n
    return engine


@pytest.mark.parametrize("policy", ["hisparse", "adaptive-spec"])
def test_open_rows_batch_matches_open_rows(policy: str) -> None:
    engine = _running(policy)
    ids, counts = list(engine.running), [1, 3, 2, 4]
    for group in engine.hierarchy.groups.values():
        twin = copy.deepcopy(group.requests)
        expect = torch.cat([open_rows(group, r, c) for r, c in zip(ids, counts, strict=True)])
        his = [group.request(r).tail_hi for r in ids]
        group.requests = twin
        got = open_rows_batch(group, ids, counts)
        assert torch.equal(got, expect)
        assert [group.request(r).tail_hi for r in ids] == his


def test_open_rows_batch_changes_nothing_on_failure() -> None:
    engine = _running("hisparse")
    group = next(iter(engine.hierarchy.groups.values()))
    ids = list(engine.running)
    before = [group.request(r).tail_hi for r in ids]
    with pytest.raises((ResourceExhausted, InvalidArgument)):  # last request fails
        open_rows_batch(group, ids, [1, 1, 1, group.config.tail_rows + 1])
    with pytest.raises(InvalidArgument):
        open_rows_batch(group, [ids[0], ids[0]], [1, 1])
    with pytest.raises(InvalidArgument):
        open_rows_batch(group, ids, [1, 0, 1, 1])
    assert [group.request(r).tail_hi for r in ids] == before


@pytest.mark.parametrize("policy", ["resident", "hisparse", "adaptive"])
def test_engine_coverage_is_the_mean_of_group_coverage(policy: str) -> None:
    engine = _running(policy)
    groups = engine.hierarchy.groups.values()
    assert engine.coverage() == sum(coverage(g) for g in groups) / len(groups)


def test_round_reads_back_once_per_batch(monkeypatch) -> None:
    """No per-request ``int(tensor)`` / ``tolist`` in the round's emission loop: at most
    two reads (the drafter's query counts, the accepted/bonus/token table)."""
    engine = _running("adaptive-spec")
    calls: list[str] = []
    real_tolist, real_int = torch.Tensor.tolist, torch.Tensor.__int__

    def tolist(self):
        if sys._getframe(1).f_code.co_name == "_round":
            calls.append("tolist")
        return real_tolist(self)

    def to_int(self):
        if sys._getframe(1).f_code.co_name in ("_round", "<listcomp>"):
            calls.append("int")
        return real_int(self)

    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    monkeypatch.setattr(torch.Tensor, "__int__", to_int)
    engine._round(list(engine.running.values()))
    assert calls == ["tolist", "tolist"], calls
