"""The GPU preset's commands (``services.decode.bench_cli`` dispatches here):

    dhisparse bench serve --device cuda --preset h200      → ``serve_h200``
    dhisparse bench load-step --device cuda --preset h200  → ``load_step_h200``

Both run ``sweep.main``'s points for their experiment and write ``h200_results.json`` +
PNGs under ``--out``.
"""

from __future__ import annotations

import sys

import typer

from services.decode.gpu_bench import sweep
from services.decode.gpu_bench.presets import H200_CONCURRENCY


def _run(only: str, out: str, budget_s: float, fused: bool, output_len: int,
         concurrency: str) -> None:
    argv = ["sweep", "--out", out, "--budget-s", str(budget_s), "--only", only,
            "--output-len", str(output_len), "--concurrency", concurrency]
    sys.argv = argv + (["--fused"] if fused else [])
    sweep.main()


def serve_h200(out: str = typer.Option(".", "--out"),
               budget_s: float = typer.Option(480.0, "--budget-s"),
               fused: bool = typer.Option(True, "--fused/--no-fused"),
               output_len: int = typer.Option(24, "--output-len"),
               concurrency: str = typer.Option(H200_CONCURRENCY, "--concurrency"),
               hot_cache_sweep: bool = typer.Option(True, "--hot-cache-sweep/--no-hot-cache-sweep"),
               ) -> None:
    """Serve sweep (Fig. 4), per-step profiles and the hot-cache sweep (Fig. 9)."""
    only = "warm,profile,serve" + (",hot" if hot_cache_sweep else "")
    _run(only, out, budget_s, fused, output_len, concurrency)


def load_step_h200(out: str = typer.Option(".", "--out"),
                   budget_s: float = typer.Option(300.0, "--budget-s"),
                   fused: bool = typer.Option(True, "--fused/--no-fused"),
                   output_len: int = typer.Option(24, "--output-len")) -> None:
    """Load step C4 → C32 → C4, residency on (adaptive) vs off (hisparse) (Fig. 6)."""
    _run("warm adaptive,warm hisparse,load-step", out, budget_s, fused, output_len,
         H200_CONCURRENCY)
