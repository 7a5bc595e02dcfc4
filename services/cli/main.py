"""``dhisparse``: one command for every service, the local cluster, load and benchmarks.

Each service owns its command body (``services/<service>/cli.py``); this module only
assembles them. Importing it must not need CUDA or CuPy.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import typer

app = typer.Typer(
    name="dhisparse",
    help="Disaggregated KV memory service for long-context sparse-attention decoding.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
bench_app = typer.Typer(help="Benchmarks (JSON out, tables on the terminal).",
                        no_args_is_help=True, rich_markup_mode=None)
app.add_typer(bench_app, name="bench")

# (typer app, command name, "module:function", one-line help)
COMMANDS: list[tuple[typer.Typer, str, str, str]] = [
    (app, "kvstore", "services.kvstore.cli:command", "Run the host-DRAM KV store (one per node)."),
    (app, "residency", "services.residency.cli:command", "Run the residency controller."),
    (app, "decode", "services.decode.cli:command", "Run a decode worker."),
    (app, "up", "services.cli.cluster:up_command", "Start a local supervised cluster."),
    (app, "load", "services.cli.cluster:load_command", "Drive a closed-loop workload."),
    (app, "status", "services.residency.cli:status_command", "Print the cluster's ledger."),
    (app, "demo", "services.cli.cluster:demo_command",
     "What `make run` runs: the most complete local scenario available."),
    (bench_app, "kvstore", "services.kvstore.cli:bench_command", "KV store throughput/latency."),
    (bench_app, "residency", "services.residency.cli:bench_command", "Admission rate/latency."),
    (bench_app, "resolver", "bench.bench_resolver:command", "Resolver kernel vs peer."),
    (bench_app, "serve", "services.decode.bench_cli:serve_command",
     "Closed-loop serving benchmark."),
    (bench_app, "load-step", "services.decode.bench_cli:load_step_command",
     "Low -> high -> low load step."),
]


def _not_implemented(name: str, target: str) -> Callable[..., Any]:
    def command(args: list[str] = typer.Argument(None, hidden=True)) -> None:
        typer.echo(f"dhisparse {name}: not implemented yet ({target} is missing)", err=True)
        raise typer.Exit(code=1)
    return command


def _resolve(target: str) -> Callable[..., Any] | None:
    module_name, attr = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            return None
        raise
    return getattr(module, attr, None)


def _register() -> None:
    for parent, name, target, help_text in COMMANDS:
        fn = _resolve(target)
        parent.command(name, help=help_text if fn is None else None)(
            fn or _not_implemented(name, target))


_register()


def main() -> None:
    """Console entry point."""
    app(prog_name="dhisparse")


if __name__ == "__main__":
    main()
    sys.exit(0)
