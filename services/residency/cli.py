"""Command bodies the ``dhisparse`` CLI wires in: ``dhisparse residency``,
``dhisparse status`` and ``dhisparse bench residency``. Unset flags fall back to
``DHISPARSE_*`` variables, then defaults."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from services.common.cli import opt, service_command

DEFAULT_ADDRESS = "127.0.0.1:50052"



@service_command("residency", "services.residency.config:ResidencyConfig",
                 "services.residency.server:main", default_port=50052)
def command(
    policy: str | None = opt("--policy", "whole-request (paper eq. 4) or elastic.",
                             "RESIDENCY_POLICY"),
    reclaim_order: str | None = opt(
        "--reclaim-order", "backed-largest (default), largest, oldest or newest.",
        "RECLAIM_ORDER"),
    populate_pages: int | None = opt("--populate-pages", "Pages per Populate (default 16).",
                                      "POPULATE_PAGES"),
    populate_inflight: int | None = opt("--populate-inflight",
                                         "Populates in flight per worker (default 2).",
                                         "POPULATE_INFLIGHT"),
    alpha_min: float | None = opt("--alpha-min", "Elastic policy: lowest alpha (0.1).",
                                   "ALPHA_MIN"),
    base_pages: int | None = opt("--base-pages", "Elastic policy: C_base in pages (1).",
                                  "BASE_PAGES"),
    request_slots: int | None = opt("--request-slots",
                                     "Slots of a worker that registers with 0 (256).",
                                     "REQUEST_SLOTS"),
    heartbeat_timeout_seconds: float | None = opt(
        "--heartbeat-timeout-seconds", "Silence after which a worker is dropped (10).",
        "HEARTBEAT_TIMEOUT_SECONDS"),
) -> None:
    """Run the residency controller (one per cluster, soft state)."""


def status_address(address: str | None, state_dir: Path) -> str:
    """``--address`` if given, else the residency of the cluster ``dhisparse up`` wrote to
    ``state_dir/cluster.json`` (it picks free ports), else DEFAULT_ADDRESS."""
    if address:
        return address
    try:  # absent or unreadable (a cluster that never started): the default
        endpoint = json.loads((state_dir / "cluster.json").read_text())["residency"]["grpc"]
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_ADDRESS
    return str(endpoint)


def status_command(
    address: str | None = typer.Option(
        None, "--address", envvar="DHISPARSE_RESIDENCY_ADDRESS",
        help=f"host:port of the residency controller [from --state-dir's cluster.json, "
             f"else {DEFAULT_ADDRESS}]."),
    state_dir: Path = typer.Option(Path("runs/cluster"),
                                   help="Where `dhisparse up` wrote cluster.json."),
    requests: bool = typer.Option(False, "--requests", help="Also list every request."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    token: str | None = opt("--token", "Shared bearer token.", "TOKEN"),
    timeout: float = typer.Option(5.0, help="Seconds to wait for the controller."),
) -> None:
    """Print the cluster's ledger: pages by kind, slots and coverage per worker."""
    import grpc
    from google.protobuf.json_format import MessageToDict

    from services.residency.status import fetch_state, render_state

    address = status_address(address, state_dir)
    try:
        state = fetch_state(address, requests, token, timeout)
    except grpc.RpcError as e:
        typer.echo(f"dhisparse status: {address}: {e.code().name}: {e.details()}", err=True)
        raise typer.Exit(code=1) from None
    if as_json:
        typer.echo(json.dumps(MessageToDict(state, preserving_proto_field_name=True), indent=2))
    else:
        render_state(state, requests)


def bench_command(
    workers: str = typer.Option("1,8,64", help="Comma-separated simulated worker counts."),
    admissions: int = typer.Option(2000, help="Admit+Release pairs per configuration."),
    concurrency: int = typer.Option(32, help="Admit calls in flight."),
    output: str | None = typer.Option(None, "--output", "-o", help="Write JSON here."),
) -> None:
    """Admissions/s and Admit latency p50/p99 for simulated workers over loopback."""
    from bench.bench_residency import BenchParams, run_and_report

    counts = tuple(int(x) for x in workers.split(",") if x.strip())
    run_and_report(BenchParams(counts, admissions, concurrency), output)
