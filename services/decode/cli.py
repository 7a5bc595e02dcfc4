"""Command body the ``dhisparse`` CLI wires in: ``dhisparse decode``. Unset flags fall back
to ``DHISPARSE_*`` variables, then defaults."""

from __future__ import annotations

import typer

from services.common.errors import ConfigError


def _opt(flag: str, help_text: str, env: str) -> typer.models.OptionInfo:
    return typer.Option(None, flag, help=help_text, envvar=f"DHISPARSE_{env}",
                        show_default=False)


def command(
    host: str | None = _opt("--host", "Bind address [127.0.0.1].", "HOST"),
    port: int | None = _opt("--port", "gRPC port, 0 = any free port [50053].", "PORT"),
    metrics_port: int | None = _opt("--metrics-port", "Prometheus /metrics port.",
                                    "METRICS_PORT"),
    residency: str | None = _opt("--residency", "HOST:PORT of the residency controller "
                                 "(unset: admit in-process, standalone).", "RESIDENCY"),
    kvstore: str | None = _opt("--kvstore", "HOST:PORT of this node's kvstore (unset: host "
                               "rows in this process).", "KVSTORE"),
    device: str | None = _opt("--device", "cpu or cuda [cpu].", "DEVICE"),
    policy: str | None = _opt("--policy", "resident, hisparse, adaptive, resident-spec or "
                              "adaptive-spec [adaptive].", "POLICY"),
    worker_id: str | None = _opt("--worker-id", "Worker id [the hostname].", "WORKER_ID"),
    advertise: str | None = _opt("--advertise", "HOST:PORT clients reach this worker at "
                                 "[host:port].", "ADVERTISE"),
    preset: str | None = _opt("--preset", "Model preset: tiny, demo, h200-deepseek [tiny].",
                              "PRESET"),
    kv_memory: str | None = _opt("--kv-memory", "KV budget M per source group, e.g. 2MiB.",
                                 "KV_MEMORY"),
    hot_cache: int | None = _opt("--hot-cache", "Hot-cache rows B per request [16].",
                                 "HOT_CACHE"),
    page_rows: int | None = _opt("--page-rows", "Rows per page [16].", "PAGE_ROWS"),
    max_requests: int | None = _opt("--max-requests", "Concurrent requests [16].",
                                    "MAX_REQUESTS"),
    max_context: int | None = _opt("--max-context", "Prompt + output limit [1024].",
                                   "MAX_CONTEXT"),
    reserve_pages: int | None = _opt("--reserve-pages", "Pages never lent [0].",
                                     "RESERVE_PAGES"),
    spec_block: int | None = _opt("--spec-block", "K_max, queries per speculative round [4].",
                                  "SPEC_BLOCK"),
    spec_mode: str | None = _opt("--spec-mode", "fixed or confidence [fixed].", "SPEC_MODE"),
    batch_invariant: bool | None = typer.Option(
        None, "--batch-invariant/--no-batch-invariant", envvar="DHISPARSE_BATCH_INVARIANT",
        help="Same tokens whatever the batch (slower) [off]."),
    seed: int | None = _opt("--seed", "Model weight seed [0].", "SEED"),
    temperature: float | None = _opt("--temperature", "Sampling temperature, 0 = greedy.",
                                     "TEMPERATURE"),
    lease_seconds: float | None = _opt("--lease-seconds", "kvstore lease of this worker's "
                                       "histories [30].", "LEASE_SECONDS"),
    admit_timeout_seconds: float | None = _opt("--admit-timeout-seconds",
                                               "Longest admission wait [120].",
                                               "ADMIT_TIMEOUT_SECONDS"),
    prefixes: str | None = _opt("--prefixes", "Prefixes to prefill at start: "
                                "name=length[:seed],...", "PREFIXES"),
    threads: int | None = _opt("--threads", "torch intra-op threads [1].", "THREADS"),
    token: str | None = _opt("--token", "Shared bearer token.", "TOKEN"),
    tls_cert: str | None = _opt("--tls-cert", "TLS certificate (PEM).", "TLS_CERT"),
    tls_key: str | None = _opt("--tls-key", "TLS key (PEM).", "TLS_KEY"),
    log_level: str | None = _opt("--log-level", "DEBUG, INFO, WARNING, ERROR.", "LOG_LEVEL"),
    log_json: bool | None = typer.Option(None, "--log-json/--log-text",
                                         envvar="DHISPARSE_LOG_JSON", help="JSON log lines."),
    port_file: str | None = _opt("--port-file", "Write the bound gRPC port here.",
                                 "PORT_FILE"),
) -> None:
    """Run a decode worker (model, KV hierarchy, speculation)."""
    from services.decode.config import DecodeConfig
    from services.decode.service import main

    overrides = {k: v for k, v in locals().items() if k not in ("DecodeConfig", "main")}
    try:
        config = DecodeConfig.load(overrides)
    except ConfigError as e:
        typer.echo(f"dhisparse decode: {e}", err=True)
        raise typer.Exit(code=2) from None
    main(config)
