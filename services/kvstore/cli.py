"""Command bodies the ``dhisparse`` CLI wires in: ``dhisparse kvstore`` and
``dhisparse bench kvstore``. Unset flags fall back to ``DHISPARSE_*`` then defaults."""

from __future__ import annotations

import typer

from services.common.cli import opt, service_command


@service_command("kvstore", "services.kvstore.config:KVStoreConfig",
                 "services.kvstore.server:main", default_port=50051)
def command(
    capacity: str | None = opt("--capacity", "Host bytes for histories, e.g. 64GiB.",
                                "CAPACITY"),
    shm_dir: str | None = opt("--shm-dir", "Directory of segments [/dev/shm].", "SHM_DIR"),
    prefix: str | None = opt("--prefix", "Segment name prefix of this store [dhisparse-kv].",
                              "PREFIX"),
    manifest_dir: str | None = opt("--manifest-dir",
                                    "Manifest directory [<shm-dir>/<prefix>.manifest].",
                                    "MANIFEST_DIR"),
    default_lease_seconds: float | None = opt("--default-lease-seconds",
                                               "Lease when a client asks for 0 [60].",
                                               "DEFAULT_LEASE_SECONDS"),
    max_lease_seconds: float | None = opt("--max-lease-seconds", "Longest lease [3600].",
                                           "MAX_LEASE_SECONDS"),
    max_chunk_bytes: str | None = opt("--max-chunk-bytes", "WriteRows/ReadRows chunk [4MiB].",
                                       "MAX_CHUNK_BYTES"),
    expiry_interval_seconds: float | None = opt("--expiry-interval-seconds",
                                                 "How often expired leases are freed [1].",
                                                 "EXPIRY_INTERVAL_SECONDS"),
    preallocate: bool | None = typer.Option(
        None, "--preallocate/--no-preallocate", envvar="DHISPARSE_PREALLOCATE",
        help="Reserve segment memory at open (fail early instead of SIGBUS) [on]."),
) -> None:
    """Run the host-DRAM KV store (one per node)."""


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
