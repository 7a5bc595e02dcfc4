"""Command bodies the ``dhisparse`` CLI wires in: ``dhisparse kvstore`` and
``dhisparse bench kvstore``. Unset flags fall back to ``DHISPARSE_*`` then defaults."""

from __future__ import annotations

import typer

from services.common.errors import ConfigError


def _opt(flag: str, help_text: str, env: str) -> typer.models.OptionInfo:
    return typer.Option(None, flag, help=help_text, envvar=f"DHISPARSE_{env}",
                        show_default=False)


def command(
    host: str | None = _opt("--host", "Bind address [127.0.0.1].", "HOST"),
    port: int | None = _opt("--port", "gRPC port, 0 = any free port [50051].", "PORT"),
    metrics_port: int | None = _opt("--metrics-port", "Prometheus /metrics port.",
                                    "METRICS_PORT"),
    capacity: str | None = _opt("--capacity", "Host bytes for histories, e.g. 64GiB.",
                                "CAPACITY"),
    shm_dir: str | None = _opt("--shm-dir", "Directory of segments [/dev/shm].", "SHM_DIR"),
    prefix: str | None = _opt("--prefix", "Segment name prefix of this store [dhisparse-kv].",
                              "PREFIX"),
    manifest_dir: str | None = _opt("--manifest-dir",
                                    "Manifest directory [<shm-dir>/<prefix>.manifest].",
                                    "MANIFEST_DIR"),
    default_lease_seconds: float | None = _opt("--default-lease-seconds",
                                               "Lease when a client asks for 0 [60].",
                                               "DEFAULT_LEASE_SECONDS"),
    max_lease_seconds: float | None = _opt("--max-lease-seconds", "Longest lease [3600].",
                                           "MAX_LEASE_SECONDS"),
    max_chunk_bytes: str | None = _opt("--max-chunk-bytes", "WriteRows/ReadRows chunk [4MiB].",
                                       "MAX_CHUNK_BYTES"),
    expiry_interval_seconds: float | None = _opt("--expiry-interval-seconds",
                                                 "How often expired leases are freed [1].",
                                                 "EXPIRY_INTERVAL_SECONDS"),
    preallocate: bool | None = typer.Option(
        None, "--preallocate/--no-preallocate", envvar="DHISPARSE_PREALLOCATE",
        help="Reserve segment memory at open (fail early instead of SIGBUS) [on]."),
    token: str | None = _opt("--token", "Shared bearer token.", "TOKEN"),
    tls_cert: str | None = _opt("--tls-cert", "TLS certificate (PEM).", "TLS_CERT"),
    tls_key: str | None = _opt("--tls-key", "TLS key (PEM).", "TLS_KEY"),
    log_level: str | None = _opt("--log-level", "DEBUG, INFO, WARNING, ERROR.", "LOG_LEVEL"),
    log_json: bool | None = typer.Option(None, "--log-json/--log-text",
                                         envvar="DHISPARSE_LOG_JSON", help="JSON log lines."),
    port_file: str | None = _opt("--port-file", "Write the bound gRPC port here.",
                                 "PORT_FILE"),
) -> None:
    """Run the host-DRAM KV store (one per node)."""
    from services.kvstore.config import KVStoreConfig
    from services.kvstore.server import main

    overrides = {k: v for k, v in locals().items() if k not in ("KVStoreConfig", "main")}
    try:
        config = KVStoreConfig.load(overrides)
    except ConfigError as e:
        typer.echo(f"dhisparse kvstore: {e}", err=True)
        raise typer.Exit(code=2) from None
    main(config)


def bench_command(
    row_bytes: int = typer.Option(4096, help="Bytes per row."),
    rows: int = typer.Option(65536, help="Rows per history (row_bytes × rows = payload)."),
    repeats: int = typer.Option(5, help="Timed repetitions (median reported)."),
    grpc_mib: int = typer.Option(256, help="MiB moved through WriteRows/ReadRows."),
    latency_ops: int = typer.Option(500, help="OpenHistory/CommitRows calls for p50/p99."),
    output: str | None = typer.Option(None, "--output", "-o", help="Write JSON here."),
) -> None:
    """Mapped-client GB/s vs memcpy, gRPC MB/s over loopback, open/commit latency."""
    from bench.bench_kvstore import BenchParams, run_and_report

    run_and_report(BenchParams(row_bytes, rows, repeats, grpc_mib, latency_ops), output)
