"""Every Prometheus series of the kvstore, on one explicit registry (DESIGN.md §5).

Store state (bytes, histories, lease expiries) is read from the core at scrape time, so
it can never drift from the truth; RPC counters are bumped by the servicer.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from services.common.metrics import LATENCY_BUCKETS
from services.kvstore.store import KVStore


class _StoreCollector(Collector):
    def __init__(self, store: KVStore) -> None:
        self._store = store

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self._store.stats()
        by_state = GaugeMetricFamily("dhisparse_kvstore_bytes", "Host bytes of the kvstore.",
                                     labels=["state"])
        by_state.add_metric(["used"], s.used_bytes)
        by_state.add_metric(["capacity"], s.capacity_bytes)
        yield by_state
        yield GaugeMetricFamily("dhisparse_kvstore_histories", "Open histories.",
                                value=s.histories)
        yield CounterMetricFamily("dhisparse_kvstore_lease_expiries",
                                  "Histories freed because their lease ran out.",
                                  value=s.lease_expiries_total)
        yield GaugeMetricFamily("dhisparse_kvstore_recovered_histories",
                                "Histories re-attached from the manifest at start.",
                                value=s.recovered_histories)


class KVStoreMetrics:
    """The kvstore's metrics; ``registry`` is what ``/metrics`` serves."""

    def __init__(self, store: KVStore, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.rpcs = Counter("dhisparse_kvstore_rpcs", "KVStore RPCs by method and status code.",
                            ["method", "code"], registry=r)
        self.rpc_errors = Counter("dhisparse_kvstore_rpc_errors",
                                  "Failed KVStore RPCs by method and status code.",
                                  ["method", "code"], registry=r)
        self.rpc_seconds = Histogram("dhisparse_kvstore_rpc_seconds",
                                     "KVStore RPC latency by method.", ["method"],
                                     buckets=LATENCY_BUCKETS, registry=r)
        self.stream_bytes = Counter("dhisparse_kvstore_stream_bytes",
                                    "Row bytes moved by WriteRows/ReadRows.", ["direction"],
                                    registry=r)
        r.register(_StoreCollector(store))

    def observe(self, method: str, code: str, seconds: float) -> None:
        self.rpcs.labels(method, code).inc()
        if code != "OK":
            self.rpc_errors.labels(method, code).inc()
        self.rpc_seconds.labels(method).observe(seconds)
