"""The services' real metric registries (services.<name>.metrics) against DESIGN.md §5 and
the Grafana dashboard."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import pytest

from tests.deploy import contract as c

METRICS_MODULES = {s: f"services.{s}.metrics" for s in c.SERVICES}


def _load_metrics_module(service: str) -> Any | None:
    name = METRICS_MODULES[service]
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        spec = None
    if spec is None:
        return None
    return importlib.import_module(name)  # an import error here is a real failure


@pytest.mark.parametrize("service", c.SERVICES)
def test_service_registry_defines_section5_series_with_their_types(service: str) -> None:
    module = _load_metrics_module(service)
    if module is None:
        pytest.skip(f"{METRICS_MODULES[service]} does not exist yet")
    defined = c.defined_metrics(module)
    assert defined, f"{module.__name__}: found no dhisparse_ metric definitions"
    by_family = {}
    for d in defined.values():
        for series in c.exposed_names(d.name, d.kind):
            if series in c.EXPOSED:
                by_family[c.EXPOSED[series]] = d
    for d in defined.values():
        family = d.name if d.name in c.SECTION5 else (
            d.name + "_total" if d.name + "_total" in c.SECTION5 else None)
        if family is None:
            continue
        kind = c.SECTION5[family][0]
        assert d.kind == kind, f"{module.__name__}: {d.name} is a {d.kind}; §5 says {kind}"
        if d.labels is not None:
            required = set(c.SECTION5[family][1])
            assert required <= d.labels, f"{module.__name__}: {d.name} lacks labels {required}"
            allowed = c.family_labels(family)
            assert d.labels <= allowed, (
                f"{module.__name__}: {d.name} has labels {d.labels - allowed} beyond §5 "
                "(never label by request id)")
    assert by_family, f"{module.__name__} defines none of the §5 series"


def test_dashboard_series_exist_in_the_service_registries() -> None:
    modules = {s: _load_metrics_module(s) for s in c.SERVICES}
    missing_modules = [METRICS_MODULES[s] for s, m in modules.items() if m is None]
    exposed: dict[str, c.Defined] = {}
    for m in modules.values():
        if m is not None:
            exposed |= c.defined_exposed(c.defined_metrics(m))
    defined_families = {d.name.removesuffix("_total") for d in exposed.values()}
    unresolved = set()
    for title, expr in c.dashboard_queries(c.dashboard()):
        for series in c.series_in(expr):
            if series in exposed:
                d = exposed[series]
                for _, matchers in c.selectors_in(expr):
                    for label, _, _ in matchers:
                        if d.labels is not None and label not in c.TARGET_LABELS:
                            assert label in d.labels, (
                                f"panel {title!r}: {series} has no label {label!r} in "
                                f"its registry (labels {sorted(d.labels)})")
                continue
            family = c.EXPOSED[series]
            assert family.removesuffix("_total") not in defined_families, (
                f"panel {title!r}: {series} is not what the registry exposes for {family} "
                f"(defined as a different type?)")
            unresolved.add(series)
    if unresolved and missing_modules:
        pytest.skip(f"metrics modules not written yet: {missing_modules}; unverified dashboard "
                    f"series: {sorted(unresolved)}")
    assert not unresolved, f"dashboard series no service registry defines: {sorted(unresolved)}"


def test_dashboard_picks_one_service_for_series_several_export() -> None:
    """A series both the controller and the workers export (pages, slots, coverage, with
    the same worker labels) is scraped once per job: a panel that sums it without a job
    matcher shows twice the pool."""
    exporters: dict[str, set[str]] = {}
    for s in c.SERVICES:
        m = _load_metrics_module(s)
        if m is not None:
            for series in c.defined_exposed(c.defined_metrics(m)):
                exporters.setdefault(series, set()).add(s)
    shared = {series for series, by in exporters.items() if len(by) > 1}
    assert shared, "no series is exported by two services: the test checks nothing"
    for title, expr in c.dashboard_queries(c.dashboard()):
        for series, matchers in c.selectors_in(expr):
            if series in shared:
                jobs = [v for label, op, v in matchers if label == "job" and op == "="]
                assert len(jobs) == 1 and jobs[0] in exporters[series], (
                    f"panel {title!r}: {series} comes from {sorted(exporters[series])}; "
                    f"pick one with job=\"...\": {expr}")
