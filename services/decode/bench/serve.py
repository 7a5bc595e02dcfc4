"""``bench serve``: the closed-loop sweep, one fresh engine per (policy, concurrency).

For every policy and offered concurrency C: an engine with C request slots and the
``--kv-memory`` budget, the prepared prefixes registered once (prefill is not timed),
then ``--requests`` requests with C in flight (``drive`` with one phase). A short
untimed warm-up per policy pays one-time costs (allocator, first kernels) first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from services.decode.bench.driver import LoadPhase, drive, make_prefixes, output_lengths
from services.decode.bench.metrics import serve_row
from services.decode.bench.settings import CLOCKS, BenchSettings
from services.decode.engine.admission import LocalAdmission
from services.decode.engine.engine import Engine
from services.decode.engine.request import RequestRun
from services.residency.core import PolicyConfig

Tokens = dict[str, dict[str, dict[str, list[int]]]]  # policy -> C -> request id -> ids


@dataclass(slots=True)
class ServeResult:
    settings: BenchSettings
    rows: list[dict[str, object]] = field(default_factory=list)
    tokens: Tokens = field(default_factory=dict)
    commands: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)


def make_engine(settings: BenchSettings, policy: str, slots: int) -> Engine:
    """A fresh engine; admission through the residency core with ``--populate-pages``
    (the engine's default ``LocalAdmission`` does not pass ``EngineConfig.populate_pages``)."""
    cfg = settings.engine_config(policy, slots)
    h = cfg.hierarchy_config()
    admission = LocalAdmission("bench", h.num_pages, h.reserve_pages, slots,
                               PolicyConfig(populate_pages=cfg.populate_pages))
    return Engine(cfg, admission=admission, clock=CLOCKS[settings.clock])


def warm_up(settings: BenchSettings, policy: str) -> None:
    engine = make_engine(settings, policy, 1)
    prefix = make_prefixes(engine.config.model.vocab, min(settings.input_len, 32), 1, 0)
    drive(engine, policy, [LoadPhase(1, requests=1)], prefix, min(settings.output_len, 4))


def run_serve(settings: BenchSettings,
              on_finish: Callable[[RequestRun], None] | None = None,
              on_point: Callable[[str, int], None] | None = None) -> ServeResult:
    """Run the sweep of validated ``settings``; ``on_finish`` sees every finished request,
    ``on_point(policy, C)`` is called before each point."""
    result = ServeResult(settings)
    lengths = output_lengths(settings.output_len, settings.output_range_ratio, settings.seed)
    for policy in settings.policies:
        warm_up(settings, policy)
        for c in settings.concurrencies:
            if on_point is not None:
                on_point(policy, c)
            engine = make_engine(settings, policy, c)
            prefixes = make_prefixes(engine.config.model.vocab, settings.input_len,
                                     settings.prefixes, settings.seed)
            rec = drive(engine, policy, [LoadPhase(c, requests=settings.requests)], prefixes,
                        lengths, tag=f"c{c}-r", on_finish=on_finish)
            result.rows.append(serve_row(rec, c))
            result.tokens.setdefault(policy, {})[str(c)] = {
                r.request_id: list(r.output) for r in rec.runs}
            result.commands.setdefault(policy, {})[str(c)] = dict(engine.stats.commands)
    return result
