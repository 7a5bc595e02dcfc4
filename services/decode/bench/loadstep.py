"""``bench load-step``: the paper's C16 → C256 → C16 experiment (§4.3.1, Fig. 6) scaled
to the machine, one arm per policy (default: ``adaptive`` = optional residency on,
``hisparse`` = off), the same engine build and budget in both arms.

Each arm is one engine with max(C) request slots driven through the phase schedule;
in-flight requests drain when the load falls, and the run ends when the engine is idle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from services.decode.bench.driver import (
    LoadPhase,
    RunRecord,
    drive,
    make_prefixes,
    output_lengths,
)
from services.decode.bench.metrics import phase_rows, timeline
from services.decode.bench.serve import Tokens, make_engine, warm_up
from services.decode.bench.settings import LoadStepSettings
from services.decode.engine.request import RequestRun


@dataclass(slots=True)
class LoadStepResult:
    settings: LoadStepSettings
    rows: list[dict[str, object]] = field(default_factory=list)
    timelines: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    phase_starts: dict[str, list[float]] = field(default_factory=dict)
    tokens: Tokens = field(default_factory=dict)
    records: dict[str, RunRecord] = field(default_factory=dict)


def phases_of(settings: LoadStepSettings) -> list[LoadPhase]:
    if settings.phase_requests is not None:
        return [LoadPhase(c, requests=settings.phase_requests) for c in settings.concurrencies]
    return [LoadPhase(c, seconds=settings.phase_seconds) for c in settings.concurrencies]


def run_load_step(settings: LoadStepSettings,
                  on_finish: Callable[[RequestRun], None] | None = None,
                  on_arm: Callable[[str], None] | None = None) -> LoadStepResult:
    result = LoadStepResult(settings)
    phases = phases_of(settings)
    lengths = output_lengths(settings.output_len, settings.output_range_ratio, settings.seed)
    for policy in settings.policies:
        warm_up(settings, policy)
        if on_arm is not None:
            on_arm(policy)
        engine = make_engine(settings, policy, max(settings.concurrencies))
        prefixes = make_prefixes(engine.config.model.vocab, settings.input_len,
                                 settings.prefixes, settings.seed)
        rec = drive(engine, policy, phases, prefixes, lengths,
                    on_finish=on_finish)
        result.records[policy] = rec
        result.rows.extend(phase_rows(rec))
        result.timelines[policy] = timeline(rec)
        result.phase_starts[policy] = list(rec.phase_starts)
        result.tokens[policy] = {"load-step": {r.request_id: list(r.output) for r in rec.runs}}
    return result
