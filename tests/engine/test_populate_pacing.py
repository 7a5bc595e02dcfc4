"""Repopulation is paced to one batch of Populate commands per engine step (a batch is at
most the controller's ``populate_inflight``): a finished request must not let the
controller refill every free page through instant in-process acks before the next
admission reclaims them. Pages still come back, tokens do not change."""

from __future__ import annotations

import collections

import pytest

import services.decode.engine.engine as engine_mod
from services.decode.engine.engine import Engine
from services.decode.engine.request import GenerateSpec
from services.residency.core import CommandKind
from tests.engine.harness import check_engine, outputs, pressured, prompts


def _run(policy: str, monkeypatch: pytest.MonkeyPatch):
    per_step: collections.Counter[int] = collections.Counter()
    step = [0]
    real = engine_mod.execute_command

    def counting(hierarchy, cmd):
        if cmd.kind is CommandKind.POPULATE:
            per_step[step[0]] += 1
        return real(hierarchy, cmd)

    monkeypatch.setattr(engine_mod, "execute_command", counting)
    engine = Engine(pressured(policy, "glm", pages=40))
    for i, prompt in enumerate(prompts(12)):  # staggered finishes: varied output caps
        engine.submit(GenerateSpec(f"r{i}", 8 + 5 * (i % 4), prompt=prompt))
    while not engine.idle:
        step[0] += 1
        engine.step()
        check_engine(engine)
    return engine, per_step


@pytest.mark.parametrize("policy", ["adaptive", "adaptive-spec"])
def test_at_most_one_populate_batch_per_step_and_pages_still_come_back(policy, monkeypatch):
    engine, per_step = _run(policy, monkeypatch)
    inflight = engine.admission.core.config.populate_inflight
    assert sum(per_step.values()) > 0, "the scenario must repopulate"
    assert max(per_step.values()) <= inflight, per_step
    assert engine.stats.commands.get("populate", 0) > 0


def test_pacing_changes_no_token(monkeypatch) -> None:
    ref = Engine(pressured("resident", "glm", pages=40))
    for i, prompt in enumerate(prompts(12)):
        ref.submit(GenerateSpec(f"r{i}", 8 + 5 * (i % 4), prompt=prompt))
    ref.run_until_idle()
    engine, _ = _run("adaptive", monkeypatch)
    assert outputs(engine) == outputs(ref)
