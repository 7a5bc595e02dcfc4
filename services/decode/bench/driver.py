"""The closed-loop client, in process: keep C requests in flight over a phase schedule.

A schedule is a list of ``LoadPhase`` (concurrency C, and an end: a number of submitted
requests or seconds). Between engine steps the driver tops the in-flight count (waiting
+ running) up to the current phase's C; when C falls, in-flight requests drain. After
the last phase nothing is submitted and the engine runs until idle. One ``Sample`` is
taken per engine step, so per-step counters can be binned over time (paper Fig. 6)::

    phase 0 (C=4)      phase 1 (C=16)          phase 2 (C=4)       drain
    |--submit≤4--------|--submit≤16------------|--submit≤4---------|--no submit--|

Requests import one of ``prefixes`` prepared prefixes (registered once per engine, each
request gets independent decode KV, as in the paper); greedy decoding.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from services.common.errors import InvalidArgument
from services.decode.engine.engine import Engine
from services.decode.engine.request import GenerateSpec, RequestRun


@dataclass(frozen=True, slots=True)
class LoadPhase:
    concurrency: int
    requests: int | None = None     # ends after this many submissions ...
    seconds: float | None = None    # ... or after this long (wall clock)


@dataclass(frozen=True, slots=True)
class Sample:
    """The engine after one step (cumulative counters; deltas give per-step rates)."""

    t: float            # seconds since the run started, at the end of the step
    dt: float           # the step's duration
    phase: int
    active: int         # requests decoding in the step (allocated request slots)
    waiting: int
    coverage: float     # ready optional / eligible history of running requests (nan: none)
    selected: int       # cumulative selection entries resolved
    host: int           # cumulative selection entries fetched from host
    reclaimed: int      # cumulative pages retired by the controller
    populated: int      # cumulative pages populated


@dataclass(slots=True)
class RunRecord:
    """Everything one run of one engine measured."""

    policy: str
    phases: list[LoadPhase]
    engine: Engine
    runs: list[RequestRun] = field(default_factory=list)      # in submission order
    run_phase: list[int] = field(default_factory=list)        # phase of each submission
    phase_starts: list[float] = field(default_factory=list)   # seconds since start
    samples: list[Sample] = field(default_factory=list)
    duration: float = 0.0
    truncated: bool = False    # stopped at ``max_seconds`` with requests still in flight


def make_prefixes(vocab: int, length: int, count: int, seed: int) -> list[list[int]]:
    """``count`` prepared prompts of ``length`` tokens (deterministic in ``seed``)."""
    gen = torch.Generator().manual_seed(seed * 7919 + 17)
    return [torch.randint(0, vocab, (length,), generator=gen).tolist() for _ in range(count)]


def output_lengths(output_len: int, ratio: float, seed: int) -> Callable[[int], int]:
    """Output cap of request ``i``: ``output_len`` (ratio 1, the paper's fixed cap) or drawn
    uniformly from [ceil(ratio·len), len], deterministic in ``seed`` and ``i``."""
    lo = max(1, math.ceil(ratio * output_len))
    if lo >= output_len:
        return lambda i: output_len
    return lambda i: random.Random(seed * 1_000_003 + i).randint(lo, output_len)


def drive(engine: Engine, policy: str, phases: list[LoadPhase], prefixes: list[list[int]],
          output_len: int | Callable[[int], int], tag: str = "r",
          on_finish: Callable[[RequestRun], None] | None = None,
          max_seconds: float | None = None) -> RunRecord:
    """Run ``phases`` on ``engine`` (fresh) until idle; returns the record. With
    ``max_seconds`` the run stops after the first step ending past it, in-flight requests
    left unfinished (``rec.truncated``): a sweep's point cannot eat the whole budget."""
    if max_seconds is not None and not max_seconds > 0:
        raise InvalidArgument(f"max_seconds={max_seconds} must be > 0")
    for i, tokens in enumerate(prefixes):
        engine.register_prefix(f"p{i}", tokens)
    rec = RunRecord(policy, phases, engine)
    length = output_len if callable(output_len) else (lambda i: output_len)
    clock = engine.clock
    start = clock()
    phase, phase_start, phase_sent = 0, 0.0, 0
    rec.phase_starts.append(0.0)
    while True:
        now = clock() - start
        while phase < len(phases) and _phase_over(phases[phase], phase_sent, now - phase_start):
            phase, phase_start, phase_sent = phase + 1, now, 0
            if phase < len(phases):
                rec.phase_starts.append(now)
        if phase < len(phases):
            limit = phases[phase].requests
            while (len(engine.waiting) + len(engine.running) < phases[phase].concurrency
                   and (limit is None or phase_sent < limit)):
                i = len(rec.runs)
                spec = GenerateSpec(f"{tag}{i}", length(i), prefix_id=f"p{i % len(prefixes)}",
                                    seed=i)
                rec.runs.append(engine.submit(spec, on_finish=on_finish))
                rec.run_phase.append(phase)
                phase_sent += 1
        elif engine.idle:
            break
        t0 = clock()
        batch = engine.step()
        t1 = clock()
        stats, counts = engine.stats, engine.stats.counts
        rec.samples.append(Sample(
            t1 - start, t1 - t0, min(phase, len(phases) - 1), len(batch), len(engine.waiting),
            engine.coverage() if engine.running else float("nan"), counts.selected,
            counts.host, stats.commands.get("retire", 0), stats.commands.get("populate", 0)))
        if max_seconds is not None and t1 - start >= max_seconds and not engine.idle:
            rec.truncated = True
            break
    rec.duration = clock() - start
    return rec


def _phase_over(p: LoadPhase, sent: int, elapsed: float) -> bool:
    if p.requests is not None:
        return sent >= p.requests
    return p.seconds is not None and elapsed >= p.seconds
