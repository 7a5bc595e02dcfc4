"""``dhisparse up`` (a supervised local cluster), ``dhisparse load`` and ``dhisparse demo``.

``up`` starts kvstore, residency and N decode workers as supervised processes (restarted
when they die), waits until every one answers gRPC health, prints the endpoints and
writes them to ``<state-dir>/cluster.json`` so ``load`` and ``status`` find them.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from services.cli.load import LoadReport, LoadSettings, run_load
from services.cli.supervisor import ProcessSpec, Supervisor, free_ports, wait_healthy

console = Console()
CLI = [sys.executable, "-m", "services.cli.main"]


@dataclass(slots=True)
class ClusterPlan:
    """Ports and argv of every process of a local cluster."""

    specs: list[ProcessSpec]
    state_dir: Path

    @property
    def decode_targets(self) -> list[str]:
        return [f"127.0.0.1:{s.port}" for s in self.specs if s.name.startswith("decode")]

    def endpoints(self) -> dict[str, dict[str, object]]:
        return {s.name: {"grpc": f"127.0.0.1:{s.port}",
                         "metrics": f"http://127.0.0.1:{s.metrics_port}/metrics"}
                for s in self.specs}


def plan_cluster(state_dir: Path, workers: int, policy: str, device: str, kv_memory: str,
                 capacity: str, preset: str, lease_s: float = 10.0) -> ClusterPlan:
    """Free ports and argv for kvstore + residency + ``workers`` decode workers."""
    ports = free_ports(2 * (2 + workers))
    kv_port, kv_metrics, res_port, res_metrics = ports[:4]
    shm_prefix = f"dhs{kv_port}"
    specs = [
        ProcessSpec("kvstore", [*CLI, "kvstore", "--host", "127.0.0.1", "--port", str(kv_port),
                                "--metrics-port", str(kv_metrics), "--capacity", capacity,
                                "--prefix", shm_prefix,
                                "--manifest", str(state_dir / "kvstore-manifest.json")],
                    kv_port, kv_metrics),
        ProcessSpec("residency", [*CLI, "residency", "--host", "127.0.0.1",
                                  "--port", str(res_port), "--metrics-port", str(res_metrics)],
                    res_port, res_metrics),
    ]
    for i in range(workers):
        port, metrics = ports[4 + 2 * i: 6 + 2 * i]
        specs.append(ProcessSpec(
            f"decode-{i}",
            [*CLI, "decode", "--host", "127.0.0.1", "--port", str(port),
             "--metrics-port", str(metrics), "--worker-id", f"decode-{i}",
             "--residency", f"127.0.0.1:{res_port}", "--kvstore", f"127.0.0.1:{kv_port}",
             "--policy", policy, "--device", device, "--kv-memory", kv_memory,
             "--preset", preset, "--lease-seconds", str(lease_s)],
            port, metrics))
    return ClusterPlan(specs, state_dir)


def start_cluster(plan: ClusterPlan, timeout_s: float = 120.0) -> Supervisor:
    """Start and health-wait every process of ``plan``; the caller stops the supervisor."""
    plan.state_dir.mkdir(parents=True, exist_ok=True)
    supervisor = Supervisor(plan.specs, plan.state_dir / "logs")
    supervisor.start()
    try:
        for spec in plan.specs:
            wait_healthy(spec.port, timeout_s=timeout_s)
    except BaseException:
        supervisor.stop()
        raise
    (plan.state_dir / "cluster.json").write_text(json.dumps(plan.endpoints(), indent=2))
    return supervisor


def print_endpoints(plan: ClusterPlan) -> None:
    table = Table(title="dhisparse cluster")
    for col in ("process", "gRPC", "metrics"):
        table.add_column(col)
    for name, ep in plan.endpoints().items():
        table.add_row(name, str(ep["grpc"]), str(ep["metrics"]))
    console.print(table)


def print_report(report: LoadReport) -> None:
    s = report.summary()
    table = Table(title="closed-loop load")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in s.items():
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    console.print(table)
    failed = [r for r in report.results if r.error]
    for r in failed[:5]:
        console.print(f"[red]{r.request_id}: {r.error}")


def drive(settings: LoadSettings) -> LoadReport:
    """Run the load with a progress bar."""
    with Progress(TextColumn("[bold]load"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("requests", total=settings.requests)
        return asyncio.run(run_load(settings, on_done=lambda _r: progress.advance(task)))


def up_command(
    workers: int = typer.Option(2, help="Decode workers to start."),
    policy: str = typer.Option("adaptive", help="Serving policy of the workers."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    kv_memory: str = typer.Option("4MiB", help="KV memory budget per worker."),
    capacity: str = typer.Option("1GiB", help="kvstore capacity."),
    preset: str = typer.Option("demo", help="Model preset."),
    state_dir: Path = typer.Option(Path("runs/cluster"), help="Logs and cluster.json."),
) -> None:
    """Start a supervised local cluster and keep it running until Ctrl-C."""
    plan = plan_cluster(state_dir, workers, policy, device, kv_memory, capacity, preset)
    supervisor = start_cluster(plan)
    print_endpoints(plan)
    console.print(f"endpoints written to {state_dir / 'cluster.json'}; Ctrl-C stops")
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        supervisor.stop()


def load_command(
    targets: str = typer.Option("", help="Comma list of decode workers (default: cluster.json)."),
    state_dir: Path = typer.Option(Path("runs/cluster"), help="Where `up` wrote cluster.json."),
    concurrency: int = typer.Option(4),
    requests: int = typer.Option(16),
    input_len: int = typer.Option(64),
    output_len: int = typer.Option(16),
    speculation: bool = typer.Option(False, "--speculation/--no-speculation"),
    spec_block: int = typer.Option(4),
    json_out: Path | None = typer.Option(None, "--json"),
    token: str | None = typer.Option(None, envvar="DHISPARSE_TOKEN"),
) -> None:
    """Drive a closed-loop workload against running decode workers."""
    if targets:
        target_list = [t for t in targets.split(",") if t]
    else:
        endpoints = json.loads((state_dir / "cluster.json").read_text())
        target_list = [str(ep["grpc"]) for name, ep in endpoints.items()
                       if name.startswith("decode")]
    try:
        settings = LoadSettings(target_list, concurrency, requests, input_len, output_len,
                                speculation, spec_block, token=token)
    except ValueError as exc:
        console.print(f"[red]{exc}")
        raise typer.Exit(2) from None
    report = drive(settings)
    print_report(report)
    if json_out:
        json_out.write_text(json.dumps(report.to_json(), indent=2))
    if any(r.error for r in report.results):
        raise typer.Exit(1)
