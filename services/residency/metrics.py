"""Every Prometheus series of the residency controller, on one explicit registry
(DESIGN.md §5), labelled by ``worker`` — never by request.

Ledger gauges come from an immutable snapshot the controller publishes from its event
loop (each tick), so the scrape thread never iterates the live ledger; the wait
histogram and the page counters are bumped as events happen.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from services.common.metrics import LATENCY_BUCKETS
from services.residency.core import ResidencyCore


@dataclass(frozen=True, slots=True)
class WorkerGauges:
    worker: str
    required: int
    optional: int
    free: int
    reserve: int
    slots_allocated: int
    slots_capacity: int
    coverage: float


def snapshot(core: ResidencyCore) -> tuple[WorkerGauges, ...]:
    return tuple(
        WorkerGauges(wid, w.required, w.allocated, w.free_pages, w.spec.reserve_pages,
                     len(w.requests), w.spec.request_slots, w.coverage)
        for wid, w in core.workers.items())


class _LedgerCollector(Collector):
    def __init__(self) -> None:
        self.snapshot: tuple[WorkerGauges, ...] = ()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap = self.snapshot   # one atomic read of an immutable tuple
        pages = GaugeMetricFamily("dhisparse_pages", "KV pool pages by kind.",
                                  labels=["worker", "kind"])
        slots = GaugeMetricFamily("dhisparse_request_slots", "Request slots by state.",
                                  labels=["worker", "state"])
        cov = GaugeMetricFamily("dhisparse_history_coverage_ratio",
                                "Ready optional history / eligible history.", labels=["worker"])
        for g in snap:
            for kind, value in (("required", g.required), ("optional", g.optional),
                                ("free", g.free), ("reserve", g.reserve)):
                pages.add_metric([g.worker, kind], value)
            slots.add_metric([g.worker, "allocated"], g.slots_allocated)
            slots.add_metric([g.worker, "capacity"], g.slots_capacity)
            cov.add_metric([g.worker], g.coverage)
        yield from (pages, slots, cov)


class ResidencyMetrics:
    """The controller's metrics; ``registry`` is what ``/metrics`` serves."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.admission_wait = Histogram(
            "dhisparse_admission_wait_seconds", "Time from Admit to grant, by worker.",
            ["worker"], buckets=LATENCY_BUCKETS, registry=r)
        self.reclaimed = Counter("dhisparse_reclaimed_pages",
                                 "Optional pages retired for admissions.", ["worker"], registry=r)
        self.populated = Counter("dhisparse_populated_pages",
                                 "Optional pages repopulated from host.", ["worker"], registry=r)
        self._ledger = _LedgerCollector()
        r.register(self._ledger)

    def refresh(self, core: ResidencyCore) -> None:
        """Publish the ledger gauges (call from the thread that owns ``core``)."""
        self._ledger.snapshot = snapshot(core)
