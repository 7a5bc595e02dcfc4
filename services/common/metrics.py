"""Prometheus helpers shared by the per-service metrics modules.

Each service defines ALL its metrics in its own ``metrics.py`` on an explicit
``CollectorRegistry`` (no global registry), and exposes it with
:func:`start_metrics_server`. Series names are the contract of DESIGN.md §5.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

# Latency buckets (seconds) shared by TTFT/TPOT/admission-wait/resolver histograms.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class MetricsServer:
    """A running /metrics HTTP endpoint (``port`` is the bound port)."""

    def __init__(self, httpd: Any, thread: Any) -> None:
        self._httpd = httpd
        self._thread = thread
        self.port: int = httpd.server_port

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def start_metrics_server(port: int | None, registry: CollectorRegistry,
                         host: str = "0.0.0.0") -> MetricsServer | None:
    """Serve ``registry`` at ``http://host:port/metrics``; ``None`` disables, 0 picks a port."""
    if port is None:
        return None
    httpd, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(httpd, thread)
