"""Every Prometheus series of a decode worker, on one explicit registry (DESIGN.md §5).

Each series carries a ``worker`` label — never a request id. Counters and histograms are
bumped from the engine thread as things happen (prometheus_client is thread-safe); the
gauges (pages, slots, coverage, host-fetch share) come from an immutable snapshot the
engine thread publishes, so a scrape never touches the live hierarchy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from services.common.metrics import LATENCY_BUCKETS

SOURCES = ("tail", "optional", "hot", "host")
TOKENS_PER_ROUND_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)


@dataclass(frozen=True, slots=True)
class WorkerGauges:
    """What the gauges show; published by the engine thread."""

    pages: tuple[tuple[str, int], ...] = ()
    slots_allocated: int = 0
    slots_capacity: int = 0
    coverage: float = 1.0
    host_fetch_share: float = 0.0


class _GaugeCollector(Collector):
    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.snapshot = WorkerGauges()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap, w = self.snapshot, self.worker   # one atomic read of an immutable object
        pages = GaugeMetricFamily("dhisparse_pages", "KV pool pages by kind.",
                                  labels=["worker", "kind"])
        for kind, value in snap.pages:
            pages.add_metric([w, kind], value)
        slots = GaugeMetricFamily("dhisparse_request_slots", "Request slots by state.",
                                  labels=["worker", "state"])
        slots.add_metric([w, "allocated"], snap.slots_allocated)
        slots.add_metric([w, "capacity"], snap.slots_capacity)
        cov = GaugeMetricFamily("dhisparse_history_coverage_ratio",
                                "Ready optional history / eligible history.", labels=["worker"])
        cov.add_metric([w], snap.coverage)
        share = GaugeMetricFamily("dhisparse_host_fetch_share",
                                  "Selected rows fetched from host / all selected rows.",
                                  labels=["worker"])
        share.add_metric([w], snap.host_fetch_share)
        yield from (pages, slots, cov, share)


class DecodeMetrics:
    """One worker's metrics; ``registry`` is what ``/metrics`` serves."""

    def __init__(self, worker: str, registry: CollectorRegistry | None = None) -> None:
        self.worker = worker
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.selected_rows = Counter(
            "dhisparse_selected_rows", "Top-k selections resolved, by where the row was.",
            ["worker", "source"], registry=r)
        self.host_fetch_bytes = Counter(
            "dhisparse_host_fetch_bytes", "Bytes copied from host backing to the device.",
            ["worker"], registry=r)
        self.resolver_seconds = Histogram(
            "dhisparse_resolver_seconds", "Wall time of one resolve (one source group).",
            ["worker"], buckets=LATENCY_BUCKETS, registry=r)
        self.backup_bytes = Counter(
            "dhisparse_backup_bytes", "Bytes of completed pages backed up to host.",
            ["worker"], registry=r)
        self.tokens_per_round = Histogram(
            "dhisparse_spec_emitted_tokens_per_round",
            "Tokens a request emitted in one decode round (speculative: accepted + 1).",
            ["worker"], buckets=TOKENS_PER_ROUND_BUCKETS, registry=r)
        self.accepted_tokens = Counter(
            "dhisparse_spec_accepted_tokens", "Draft tokens accepted by verification.",
            ["worker"], registry=r)
        self.ttft = Histogram("dhisparse_ttft_seconds", "Arrival to first token.", ["worker"],
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("dhisparse_tpot_seconds", "Mean time per output token after the "
                              "first, per request.", ["worker"], buckets=LATENCY_BUCKETS,
                              registry=r)
        self.output_tokens = Counter("dhisparse_output_tokens", "Tokens streamed to clients.",
                                     ["worker"], registry=r)
        self._gauges = _GaugeCollector(worker)
        r.register(self._gauges)
        for source in SOURCES:            # every series exists from the first scrape
            self.selected_rows.labels(worker, source)
        for metric in (self.host_fetch_bytes, self.resolver_seconds, self.backup_bytes,
                       self.tokens_per_round, self.accepted_tokens, self.ttft, self.tpot,
                       self.output_tokens):
            metric.labels(worker)

    def publish(self, gauges: WorkerGauges) -> None:
        self._gauges.snapshot = gauges

    @property
    def gauges(self) -> WorkerGauges:
        return self._gauges.snapshot
