"""The capacity effects the default benchmark must show (default preset, budget, input
length and hot cache; fewer and shorter requests so it runs in seconds):

- low load: adaptive keeps the history resident and fetches from host at most a fifth
  of what hisparse fetches;
- high load: within the same budget, hisparse and adaptive keep more sessions active
  than resident, whose whole history must fit."""

from __future__ import annotations

import functools

import pytest

from services.decode.bench.serve import ServeResult, run_serve
from services.decode.bench.settings import BenchSettings

LOW, HIGH = 2, 16


@functools.cache
def sweep() -> ServeResult:
    settings = BenchSettings(policy="resident,hisparse,adaptive", concurrency=f"{LOW},{HIGH}",
                             requests=HIGH, output_len=16)
    return run_serve(settings.validate())


def row(policy: str, c: int) -> dict[str, object]:
    return next(r for r in sweep().rows if r["policy"] == policy and r["concurrency"] == c)


def test_default_budget_straddles_the_sweep() -> None:
    """Resident histories stop fitting inside the default sweep, offloaded ones do not."""
    d = BenchSettings().validate()
    low, high = min(d.concurrencies), max(d.concurrencies)
    resident = d.engine_config("resident", high)
    adaptive = d.engine_config("adaptive", high)
    fits = resident.num_pages // resident.required_pages_for(d.max_rows(resident))
    assert low <= fits < high
    history = d.input_len // d.page_rows
    assert low * (adaptive.required_pages + history) <= adaptive.num_pages  # all resident
    assert high * adaptive.required_pages <= adaptive.num_pages               # all admitted


def test_low_load_adaptive_fetches_at_most_a_fifth_of_hisparse() -> None:
    hisparse, adaptive = row("hisparse", LOW), row("adaptive", LOW)
    assert hisparse["host_fetch_share"] > 0.5
    assert adaptive["host_fetch_share"] <= hisparse["host_fetch_share"] / 5
    assert adaptive["host_fetched_rows"] <= hisparse["host_fetched_rows"] / 5
    assert adaptive["coverage_mean"] > 0.99
    assert hisparse["coverage_mean"] == 0.0


@pytest.mark.parametrize("policy", ["hisparse", "adaptive"])
def test_high_load_offloading_keeps_more_sessions_active(policy: str) -> None:
    resident, other = row("resident", HIGH), row(policy, HIGH)
    assert resident["active_max"] < HIGH          # the budget, not C, limits resident
    assert other["active_mean"] > resident["active_mean"] + 2
    assert other["active_max"] == HIGH
    assert resident["ttft_mean_s"] > other["ttft_mean_s"]  # the rest wait for a slot


def test_high_load_adaptive_reclaims_optional_history() -> None:
    adaptive = row("adaptive", HIGH)
    assert adaptive["reclaimed_pages"] > 0
    assert adaptive["coverage_mean"] < row("adaptive", LOW)["coverage_mean"]
