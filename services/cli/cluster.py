"""``dhisparse up`` (a supervised local cluster), ``dhisparse load`` and ``dhisparse demo``.

``up`` starts kvstore, residency and N decode workers as supervised processes (restarted
when they die), waits until every one answers gRPC health, prints the endpoints and
writes them to ``<state-dir>/cluster.json`` so ``load`` and ``status`` find them.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
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
if not console.is_terminal:            # pipes and CI logs: tables wide enough to read
    console = Console(width=max(console.width, 132))
CLI = [sys.executable, "-m", "services.cli.main"]


@dataclass(slots=True)
class ClusterSettings:
    """What a local cluster runs: N workers of one policy and model, one kvstore, one
    controller. Short leases and heartbeat timeouts make fault tests fast."""

    workers: int = 2
    policy: str = "adaptive"
    preset: str = "demo"
    device: str = "cpu"
    kv_memory: str = "4MiB"
    capacity: str = "1GiB"
    max_requests: int = 8
    max_context: int = 1024
    hot_cache: int = 16
    page_rows: int = 16
    spec_block: int = 4
    batch_invariant: bool = False
    prefixes: str = ""
    lease_s: float = 10.0
    heartbeat_timeout_s: float = 10.0
    extra_decode: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"--workers={self.workers}: must be >= 1")


@dataclass(slots=True)
class ClusterPlan:
    """Ports and argv of every process of a local cluster."""

    specs: list[ProcessSpec]
    state_dir: Path
    shm_dir: Path

    @property
    def decode_targets(self) -> list[str]:
        return [f"127.0.0.1:{s.port}" for s in self.specs if s.name.startswith("decode")]

    def spec(self, name: str) -> ProcessSpec:
        return next(s for s in self.specs if s.name == name)

    def endpoints(self) -> dict[str, dict[str, object]]:
        return {s.name: {"grpc": f"127.0.0.1:{s.port}",
                         "metrics": f"http://127.0.0.1:{s.metrics_port}/metrics"}
                for s in self.specs}


def default_shm_root() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def plan_cluster(state_dir: Path, settings: ClusterSettings,
                 shm_root: Path | None = None) -> ClusterPlan:
    """Free ports and argv for kvstore + residency + ``settings.workers`` decode workers.
    The kvstore's segments and manifest live in a fresh directory under ``shm_root``."""
    st = settings
    ports = free_ports(2 * (2 + st.workers))
    kv_port, kv_metrics, res_port, res_metrics = ports[:4]
    shm_dir = Path(tempfile.mkdtemp(prefix=f"dhisparse-{kv_port}-",
                                    dir=shm_root or default_shm_root()))
    common = ["--host", "127.0.0.1", "--log-level", "INFO"]
    specs = [
        ProcessSpec("kvstore", [*CLI, "kvstore", *common, "--port", str(kv_port),
                                "--metrics-port", str(kv_metrics), "--capacity", st.capacity,
                                "--shm-dir", str(shm_dir), "--prefix", "dhs",
                                "--expiry-interval-seconds", "0.25"],
                    kv_port, kv_metrics),
        ProcessSpec("residency", [*CLI, "residency", *common, "--port", str(res_port),
                                  "--metrics-port", str(res_metrics),
                                  "--heartbeat-timeout-seconds", str(st.heartbeat_timeout_s)],
                    res_port, res_metrics),
    ]
    for i in range(st.workers):
        port, metrics = ports[4 + 2 * i: 6 + 2 * i]
        specs.append(ProcessSpec(
            f"decode-{i}",
            [*CLI, "decode", *common, "--port", str(port), "--metrics-port", str(metrics),
             "--worker-id", f"decode-{i}", "--residency", f"127.0.0.1:{res_port}",
             "--kvstore", f"127.0.0.1:{kv_port}", "--policy", st.policy,
             "--device", st.device, "--kv-memory", st.kv_memory, "--preset", st.preset,
             "--max-requests", str(st.max_requests), "--max-context", str(st.max_context),
             "--hot-cache", str(st.hot_cache), "--page-rows", str(st.page_rows),
             "--spec-block", str(st.spec_block), "--lease-seconds", str(st.lease_s),
             "--batch-invariant" if st.batch_invariant else "--no-batch-invariant",
             *(["--prefixes", st.prefixes] if st.prefixes else []), *st.extra_decode],
            port, metrics, env={"OMP_NUM_THREADS": "1"}))
    return ClusterPlan(specs, state_dir, shm_dir)


class Cluster:
    """A started local cluster: its plan and supervisor; ``stop`` also removes the shm."""

    def __init__(self, plan: ClusterPlan, supervisor: Supervisor) -> None:
        self.plan, self.supervisor = plan, supervisor

    def stop(self) -> None:
        try:
            self.supervisor.stop()
        finally:
            shutil.rmtree(self.plan.shm_dir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_cluster(plan: ClusterPlan, timeout_s: float = 120.0) -> Cluster:
    """Start and health-wait every process of ``plan``; the caller stops the cluster."""
    plan.state_dir.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(plan, Supervisor(plan.specs, plan.state_dir / "logs"))
    cluster.supervisor.start()
    try:
        for spec in plan.specs:
            wait_healthy(spec.port, timeout_s=timeout_s)
    except BaseException:
        cluster.stop()
        raise
    (plan.state_dir / "cluster.json").write_text(json.dumps(plan.endpoints(), indent=2))
    return cluster


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


def scrape(url: str, timeout: float = 5.0) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """One /metrics page as {(series name, sorted labels): value}."""
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    with urlopen(url, timeout=timeout) as r:
        text = r.read().decode()
    return {(smp.name, tuple(sorted(smp.labels.items()))): smp.value
            for fam in text_string_to_metric_families(text) for smp in fam.samples}


def try_scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    try:
        return scrape(url)
    except OSError as exc:
        console.print(f"[yellow]{url}: {exc}")
        return {}


def metric_sum(samples: dict, name: str, **labels: str) -> float:
    """Sum of ``name`` over the samples whose labels include ``labels``."""
    return sum(v for (n, lbls), v in samples.items()
               if n == name and all((k, val) in lbls for k, val in labels.items()))


def print_cluster_figures(plan: ClusterPlan) -> None:
    """What the workers and the controller measured, read from their /metrics."""
    table = Table(title="cluster metrics (from /metrics)")
    for col in ("process", "output tokens", "tokens/round", "host-fetch share", "coverage",
                "host fetch", "backup", "TTFT mean", "TPOT mean"):
        table.add_column(col, justify="right")
    for spec in plan.specs:
        if not spec.name.startswith("decode"):
            continue
        m = try_scrape(f"http://127.0.0.1:{spec.metrics_port}/metrics")
        rounds = metric_sum(m, "dhisparse_spec_emitted_tokens_per_round_count")
        count = metric_sum(m, "dhisparse_ttft_seconds_count") or 1.0
        table.add_row(
            spec.name, f"{metric_sum(m, 'dhisparse_output_tokens_total'):.0f}",
            f"{metric_sum(m, 'dhisparse_spec_emitted_tokens_per_round_sum') / rounds:.2f}"
            if rounds else "-",
            f"{metric_sum(m, 'dhisparse_host_fetch_share'):.3f}",
            f"{metric_sum(m, 'dhisparse_history_coverage_ratio'):.2f}",
            f"{metric_sum(m, 'dhisparse_host_fetch_bytes_total') / 1024:.0f} KiB",
            f"{metric_sum(m, 'dhisparse_backup_bytes_total') / 1024:.0f} KiB",
            f"{metric_sum(m, 'dhisparse_ttft_seconds_sum') / count * 1e3:.1f} ms",
            f"{metric_sum(m, 'dhisparse_tpot_seconds_sum') / count * 1e3:.1f} ms")
    console.print(table)
    r = try_scrape(f"http://127.0.0.1:{plan.spec('residency').metrics_port}/metrics")
    waits = metric_sum(r, "dhisparse_admission_wait_seconds_count") or 1.0
    console.print(
        f"residency: admissions {metric_sum(r, 'dhisparse_admission_wait_seconds_count'):.0f}, "
        f"mean admission wait "
        f"{metric_sum(r, 'dhisparse_admission_wait_seconds_sum') / waits * 1e3:.1f} ms, "
        f"reclaimed pages {metric_sum(r, 'dhisparse_reclaimed_pages_total'):.0f}, "
        f"populated pages {metric_sum(r, 'dhisparse_populated_pages_total'):.0f}")
    k = try_scrape(f"http://127.0.0.1:{plan.spec('kvstore').metrics_port}/metrics")
    console.print(f"kvstore: histories {metric_sum(k, 'dhisparse_kvstore_histories'):.0f}, "
                  f"used {metric_sum(k, 'dhisparse_kvstore_bytes', state='used') / 2**20:.2f} "
                  "MiB")


def print_metrics_urls(plan: ClusterPlan) -> None:
    console.print("metrics: " + "  ".join(f"{name}={ep['metrics']}"
                                          for name, ep in plan.endpoints().items()))


def up_command(
    workers: int = typer.Option(2, help="Decode workers to start."),
    policy: str = typer.Option("adaptive", help="Serving policy of the workers."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    kv_memory: str = typer.Option("4MiB", help="KV memory budget per worker."),
    capacity: str = typer.Option("1GiB", help="kvstore capacity."),
    preset: str = typer.Option("demo", help="Model preset."),
    max_requests: int = typer.Option(8, help="Concurrent requests per worker."),
    prefixes: str = typer.Option("", help="Prefixes every worker prefills: name=len[:seed],..."),
    state_dir: Path = typer.Option(Path("runs/cluster"), help="Logs and cluster.json."),
) -> None:
    """Start a supervised local cluster and keep it running until Ctrl-C."""
    settings = ClusterSettings(workers=workers, policy=policy, preset=preset, device=device,
                               kv_memory=kv_memory, capacity=capacity,
                               max_requests=max_requests, prefixes=prefixes)
    plan = plan_cluster(state_dir, settings)
    _stop_on_signals()
    cluster = start_cluster(plan)
    try:
        print_endpoints(plan)
        console.print(f"endpoints written to {state_dir / 'cluster.json'}; logs in "
                      f"{state_dir / 'logs'}; Ctrl-C stops")
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


def _stop_on_signals() -> None:
    """Ctrl-C and SIGTERM both stop the cluster cleanly (SIGINT even when the shell
    started us with it ignored, as background jobs are)."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)


def _targets(targets: str, state_dir: Path) -> list[str]:
    if targets:
        return [t for t in targets.split(",") if t]
    path = state_dir / "cluster.json"
    if not path.exists():
        console.print(f"[red]no --targets and no {path}: start a cluster with `dhisparse up`")
        raise typer.Exit(2)
    endpoints = json.loads(path.read_text())
    return [str(ep["grpc"]) for name, ep in endpoints.items() if name.startswith("decode")]


def load_command(
    targets: str = typer.Option("", help="Comma list of decode workers (default: cluster.json)."),
    state_dir: Path = typer.Option(Path("runs/cluster"), help="Where `up` wrote cluster.json."),
    concurrency: int = typer.Option(4, help="Requests kept in flight."),
    requests: int = typer.Option(16, help="Requests in total."),
    input_len: int = typer.Option(64, help="Prompt tokens per request."),
    output_len: int = typer.Option(16, help="Output cap per request."),
    speculation: bool = typer.Option(False, "--speculation/--no-speculation", help=(
        "Draft-model speculation (needs workers of a -spec policy: `up --policy adaptive-spec`).")),
    spec_block: int = typer.Option(4, help="K_r per round with speculation."),
    prefix_id: str = typer.Option("", help="Import this registered prefix instead of a prompt."),
    seed: int = typer.Option(0, help="Prompt seed (also names the requests)."),
    json_out: Path | None = typer.Option(None, "--json"),
    token: str | None = typer.Option(None, envvar="DHISPARSE_TOKEN"),
) -> None:
    """Drive a closed-loop workload against running decode workers."""
    try:
        settings = LoadSettings(_targets(targets, state_dir), concurrency, requests, input_len,
                                output_len, speculation, spec_block, prefix_id=prefix_id,
                                seed=seed, token=token)
    except ValueError as exc:
        console.print(f"[red]{exc}")
        raise typer.Exit(2) from None
    report = drive(settings)
    print_report(report)
    if json_out:
        json_out.write_text(json.dumps(report.to_json(), indent=2))
    if any(r.error for r in report.results):
        raise typer.Exit(1)


def demo_command(
    workers: int = typer.Option(2, help="Decode workers."),
    requests: int = typer.Option(32, help="Requests per phase."),
    concurrency: int = typer.Option(12, help="Requests in flight."),
    input_len: int = typer.Option(384, help="Prompt tokens (24 pages: the pools contend)."),
    output_len: int = typer.Option(32, help="Output cap."),
    kv_memory: str = typer.Option("768KiB", help="KV budget per worker (small: contention)."),
    state_dir: Path = typer.Option(Path("runs/demo"), help="Logs and cluster.json."),
) -> None:
    """`make run`: a local cluster (kvstore, residency, 2 adaptive-spec workers on the CPU
    demo model), a closed-loop load without and with speculation, the report, shutdown."""
    settings = ClusterSettings(workers=workers, policy="adaptive-spec", preset="demo",
                               kv_memory=kv_memory, max_requests=max(4, concurrency),
                               max_context=1024)
    plan = plan_cluster(state_dir, settings)
    _stop_on_signals()
    console.print(f"starting kvstore, residency and {workers} decode workers "
                  f"(logs: {state_dir / 'logs'}) ...")
    t0 = time.perf_counter()
    failed = False
    with start_cluster(plan) as cluster:
        console.print(f"cluster healthy in {time.perf_counter() - t0:.1f}s")
        print_endpoints(plan)
        for speculation in (False, True):
            console.print(f"\n[bold]load: {requests} requests, concurrency {concurrency}, "
                          f"prompt {input_len}, output {output_len}, speculation "
                          f"{'on (K=4)' if speculation else 'off'}")
            report = drive(LoadSettings(plan.decode_targets, concurrency, requests, input_len,
                                        output_len, speculation, 4, seed=int(speculation)))
            print_report(report)
            failed |= any(r.error for r in report.results)
        print_cluster_figures(plan)
        print_metrics_urls(plan)
        restarts = {s.name: cluster.supervisor.restarts(s.name) for s in plan.specs}
        console.print("stopping the cluster ...")
    console.print(f"done in {time.perf_counter() - t0:.1f}s; process restarts: {restarts}")
    if failed:
        raise typer.Exit(1)
