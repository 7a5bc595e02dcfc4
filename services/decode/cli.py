"""Command body the ``dhisparse`` CLI wires in: ``dhisparse decode``. Unset flags fall back
to ``DHISPARSE_*`` variables, then defaults."""

from __future__ import annotations

import typer

from services.common.cli import opt, service_command


@service_command("decode", "services.decode.config:DecodeConfig",
                 "services.decode.service:main", default_port=50053)
def command(
    residency: str | None = opt("--residency", "HOST:PORT of the residency controller "
                                 "(unset: admit in-process, standalone).", "RESIDENCY"),
    kvstore: str | None = opt("--kvstore", "HOST:PORT of this node's kvstore (unset: host "
                               "rows in this process).", "KVSTORE"),
    device: str | None = opt("--device", "cpu or cuda [cpu].", "DEVICE"),
    policy: str | None = opt("--policy", "resident, hisparse, adaptive, resident-spec or "
                              "adaptive-spec [adaptive].", "POLICY"),
    worker_id: str | None = opt("--worker-id", "Worker id [the hostname].", "WORKER_ID"),
    advertise: str | None = opt("--advertise", "HOST:PORT clients reach this worker at "
                                 "[host:port].", "ADVERTISE"),
    preset: str | None = opt("--preset", "Model preset: tiny, demo, h200-deepseek [tiny].",
                              "PRESET"),
    kv_memory: str | None = opt("--kv-memory", "KV budget M per source group, e.g. 2MiB.",
                                 "KV_MEMORY"),
    hot_cache: int | None = opt("--hot-cache", "Hot-cache rows B per request [16].",
                                 "HOT_CACHE"),
    page_rows: int | None = opt("--page-rows", "Rows per page [16].", "PAGE_ROWS"),
    max_requests: int | None = opt("--max-requests", "Concurrent requests [16].",
                                    "MAX_REQUESTS"),
    max_context: int | None = opt("--max-context", "Prompt + output limit [1024].",
                                   "MAX_CONTEXT"),
    reserve_pages: int | None = opt("--reserve-pages", "Pages never lent [0].",
                                     "RESERVE_PAGES"),
    spec_block: int | None = opt("--spec-block", "K_max, queries per speculative round [4].",
                                  "SPEC_BLOCK"),
    spec_mode: str | None = opt("--spec-mode", "fixed or confidence [fixed].", "SPEC_MODE"),
    batch_invariant: bool | None = typer.Option(
        None, "--batch-invariant/--no-batch-invariant", envvar="DHISPARSE_BATCH_INVARIANT",
        help="Same tokens whatever the batch (slower) [off]."),
    seed: int | None = opt("--seed", "Model weight seed [0].", "SEED"),
    temperature: float | None = opt("--temperature", "Sampling temperature, 0 = greedy.",
                                     "TEMPERATURE"),
    lease_seconds: float | None = opt("--lease-seconds", "kvstore lease of this worker's "
                                       "histories [30].", "LEASE_SECONDS"),
    admit_timeout_seconds: float | None = opt("--admit-timeout-seconds",
                                               "Longest admission wait [120].",
                                               "ADMIT_TIMEOUT_SECONDS"),
    prefixes: str | None = opt("--prefixes", "Prefixes to prefill at start: "
                                "name=length[:seed],...", "PREFIXES"),
    threads: int | None = opt("--threads", "torch intra-op threads [1].", "THREADS"),
) -> None:
    """Run a decode worker (model, KV hierarchy, speculation)."""
