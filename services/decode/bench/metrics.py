"""What a run measured, as the JSON rows of the benchmarks.

Definitions (paper §4.1, Table 2, Fig. 6):

    output_tokens_per_s   returned tokens / wall time from the first submission to idle
    ttft                  first token time - submission (admission wait + prefix import)
    ttft_postwave         TTFT of the requests after the first C submitted
    tpot                  per request (last - first token time) / (tokens - 1), then mean
    active_mean           time-weighted mean of requests decoding at once over the central
                          half of the run (Table 2's "Active")
    host_fetch_share      selection entries fetched from host / all selection entries
    coverage_mean         time-weighted mean of ready optional / eligible history, over
                          steps with requests running (resident: 1, hisparse: 0)
    spec_tokens_per_round tokens a request emits per decode round (1 without speculation)
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from services.decode.bench.driver import RunRecord, Sample
from services.decode.engine.request import RequestRun


def mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, -(-int(q * len(ordered)) // 100))  # ceil(q/100 · n)
    return ordered[min(rank, len(ordered)) - 1]


def weighted(samples: Sequence[Sample], value, lo: float = float("-inf"),
             hi: float = float("inf")) -> float:
    """Time-weighted mean of ``value(sample)`` over the steps overlapping ``[lo, hi)``."""
    total = acc = 0.0
    for s in samples:
        w = min(s.t, hi) - max(s.t - s.dt, lo)
        if w > 0:
            total += w
            acc += w * value(s)
    return acc / total if total else 0.0


def request_stats(runs: Sequence[RequestRun], skip: int = 0) -> dict[str, float]:
    ttft = [r.ttft for r in runs if r.ttft is not None]
    post = [r.ttft for r in runs[skip:] if r.ttft is not None]
    return {
        "requests": len(runs),
        "ttft_mean_s": mean(ttft),
        "ttft_p99_s": percentile(ttft, 99),
        "ttft_postwave_mean_s": mean(post),
        "tpot_mean_s": mean([r.tpot for r in runs if r.tpot is not None]),
        "admission_wait_mean_s": mean([r.admission_wait for r in runs
                                       if r.admission_wait is not None]),
    }


def share(host: int, selected: int) -> float:
    return host / selected if selected else 0.0


def host_fetch_steps(samples: Sequence[Sample]) -> float:
    """Share of decode steps that fetched at least one row from host."""
    prev, fetched, steps = 0, 0, 0
    for x in samples:
        if x.active:
            steps += 1
            fetched += x.host > prev
        prev = x.host
    return fetched / steps if steps else 0.0


def serve_row(rec: RunRecord, concurrency: int) -> dict[str, object]:
    """One JSON row of ``bench serve``: a policy at one offered concurrency."""
    stats, counts, s = rec.engine.stats, rec.engine.stats.counts, rec.samples
    out = sum(len(r.output) for r in rec.runs)
    busy = [x for x in s if x.coverage == x.coverage]  # steps with requests running
    cfg = rec.engine.config
    longest = max((r.prompt_len + r.spec.max_new_tokens + cfg.k_max for r in rec.runs),
                  default=0)
    return {
        "policy": rec.policy,
        "concurrency": concurrency,
        "slots": cfg.max_requests,
        "kv_pages": cfg.num_pages,
        "request_required_pages": cfg.required_pages_for(longest),
        "output_tokens": out,
        "finished_requests": sum(r.finished_at is not None for r in rec.runs),
        "truncated": rec.truncated,
        "duration_s": rec.duration,
        "output_tokens_per_s": out / rec.duration if rec.duration else 0.0,
        **request_stats(rec.runs, skip=concurrency),
        "active_mean": weighted(s, lambda x: x.active, rec.duration / 4, 3 * rec.duration / 4),
        "active_max": max((x.active for x in s), default=0),
        "host_fetch_share": counts.host_fetch_share,
        "host_fetch_steps": host_fetch_steps(s),
        "host_fetched_rows": counts.host_rows,
        "selected_rows": counts.selected,
        "coverage_mean": weighted(busy, lambda x: x.coverage),
        "spec_tokens_per_round": stats.tokens_per_round,
        "rounds": stats.rounds,
        "steps": stats.steps,
        "step_mean_s": stats.step_seconds / stats.steps if stats.steps else 0.0,
        "reclaimed_pages": stats.commands.get("retire", 0),
        "backed_up_pages": stats.commands.get("backup", 0),
        "populated_pages": stats.commands.get("populate", 0),
        "commands": dict(stats.commands),
        "host_phase_seconds": dict(stats.host_phase_seconds),
    }


def phase_rows(rec: RunRecord) -> list[dict[str, object]]:
    """Per-phase rows of ``bench load-step`` (paper Table A1): a phase is the time from its
    start to the next phase's start (the last one runs to idle)."""
    rows = []
    bounds = [*rec.phase_starts, rec.duration]
    for i, phase in enumerate(rec.phases[: len(rec.phase_starts)]):
        lo, hi = bounds[i], bounds[i + 1]
        inside = [x for x in rec.samples if lo < x.t <= hi]
        before = [x for x in rec.samples if x.t <= lo]
        first = before[-1] if before else None
        last = inside[-1] if inside else first

        def delta(field: str, first=first, last=last) -> int:
            a = getattr(first, field) if first else 0
            return (getattr(last, field) if last else 0) - a

        runs = [r for r, p in zip(rec.runs, rec.run_phase, strict=True) if p == i]
        rows.append({
            "policy": rec.policy, "phase": i, "concurrency": phase.concurrency,
            "start_s": lo, "end_s": hi,
            "allocated_mean": weighted(rec.samples, lambda x: x.active, lo, hi),
            "coverage_mean": weighted([x for x in inside if x.coverage == x.coverage],
                                      lambda x: x.coverage),
            "host_fetch_share": share(delta("host"), delta("selected")),
            "output_tokens": sum(len(r.output) for r in runs),
            **request_stats(runs),
            "reclaimed_pages": delta("reclaimed"),
            "populated_pages": delta("populated"),
        })
    return rows


def timeline(rec: RunRecord, bins: int = 60) -> dict[str, list[float]]:
    """Per-step counters in ``bins`` equal time bins: allocated slots and coverage
    (time-weighted), host-fetch share (Σ host / Σ selected in the bin)."""
    width = rec.duration / bins if rec.duration else 1.0
    out: dict[str, list[float]] = {"t": [], "allocated": [], "coverage": [],
                                   "host_fetch_share": []}
    prev = (0, 0)
    for b in range(bins):
        lo, hi = b * width, (b + 1) * width
        inside = [x for x in rec.samples if lo < x.t <= hi]
        if not inside:
            continue
        last = (inside[-1].selected, inside[-1].host)
        out["t"].append((lo + hi) / 2)
        out["allocated"].append(weighted(rec.samples, lambda x: x.active, lo, hi))
        busy = [x for x in inside if x.coverage == x.coverage]
        out["coverage"].append(weighted(busy, lambda x: x.coverage) if busy else float("nan"))
        out["host_fetch_share"].append(share(last[1] - prev[1], last[0] - prev[0]))
        prev = last
    return out
