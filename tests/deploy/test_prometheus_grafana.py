"""Static checks of deploy/prometheus.yml, the Grafana provisioning and the dashboard: what
Prometheus scrapes, and that every dashboard query reads DESIGN.md §5 series correctly."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.deploy import contract as c

# =========================================================================== prometheus


def test_prometheus_scrapes_every_compose_service_on_its_metrics_port() -> None:
    targets = c.scrape_targets()
    for inv in c.compose_invocations():
        metrics = int(inv.value("--metrics-port") or 0)
        service = inv.origin.split(":")[1]
        assert (service, metrics) in targets.get(inv.sub, set()), (
            f"prometheus.yml job {inv.sub} does not scrape {service}:{metrics}: {targets}")
    compose_services = set(c.compose()["services"])
    for job, hosts in targets.items():
        for host, port in hosts:
            if host == "localhost":
                continue
            assert host in compose_services, f"job {job} scrapes unknown host {host}"
            if job in c.PORTS:
                assert port == c.PORTS[job][1], f"job {job} scrapes port {port}"


def test_prometheus_discovers_scaled_decode_workers_by_dns() -> None:
    decode = next(j for j in c.prometheus()["scrape_configs"] if j["job_name"] == "decode")
    assert "static_configs" not in decode, "static targets cannot follow --scale decode=N"
    assert decode["dns_sd_configs"][0]["names"] == ["decode"]
    assert int(decode["dns_sd_configs"][0]["port"]) == c.PORTS["decode"][1]


# =========================================================================== grafana


def test_grafana_datasource_is_the_compose_prometheus_with_the_dashboards_uid() -> None:
    ds = c.load_yaml(c.GRAFANA_PROVISIONING / "datasources" / "prometheus.yml")["datasources"]
    assert len(ds) == 1 and ds[0]["type"] == "prometheus"
    assert ds[0]["url"] == "http://prometheus:9090"
    uid = ds[0]["uid"]
    dash = c.dashboard()

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            for obj in (p, *p.get("targets", [])):
                if "datasource" in obj:
                    assert obj["datasource"]["uid"] == uid, (p.get("title"), obj["datasource"])
            walk(p.get("panels", []))

    walk(dash["panels"])
    for var in dash["templating"]["list"]:
        if "datasource" in var:
            assert var["datasource"]["uid"] == uid


def test_dashboard_names_only_section5_series() -> None:
    queries = c.dashboard_queries(c.dashboard())
    assert queries, "the dashboard has no queries"
    for title, expr in queries:
        names = c.series_in(expr)
        assert names, f"panel {title!r}: query names no dhisparse series: {expr}"
        unknown = [n for n in names if n not in c.EXPOSED]
        assert not unknown, (f"panel {title!r}: {unknown} are not DESIGN.md §5 series "
                             f"(histograms: _bucket/_sum/_count; counters keep _total): {expr}")


def test_dashboard_label_matchers_and_groupings_fit_the_series() -> None:
    for title, expr in c.dashboard_queries(c.dashboard()):
        families = {c.EXPOSED[n] for n in c.series_in(expr) if n in c.EXPOSED}
        for series, matchers in c.selectors_in(expr):
            family = c.EXPOSED[series]
            allowed = c.family_labels(family) | c.TARGET_LABELS
            for label, op, value in matchers:
                assert label in allowed, f"panel {title!r}: {series} has no label {label!r}"
                values = c.SECTION5[family][1].get(label)
                if values is not None and op == "=":
                    assert value in values, (
                        f"panel {title!r}: {series}{{{label}={value!r}}}: §5 allows {values}")
        allowed = set().union(*(c.family_labels(f) for f in families)) | c.TARGET_LABELS
        if "histogram_quantile" in expr:
            allowed.add("le")
        extra = c.grouping_labels(expr) - allowed
        assert not extra, f"panel {title!r}: groups by {extra}, not labels of {families}"


def test_dashboard_uses_counters_and_histograms_correctly() -> None:
    for title, expr in c.dashboard_queries(c.dashboard()):
        if title.startswith("templating:"):
            continue
        for series in c.series_in(expr):
            kind = c.SECTION5[c.EXPOSED[series]][0]
            if kind in ("counter", "histogram"):
                assert re.search(rf"\b(?:rate|irate|increase)\(\s*{series}\b", expr), (
                    f"panel {title!r}: {kind} series {series} must be read through rate()")
            if series.endswith("_bucket"):
                assert "histogram_quantile(" in expr and re.search(r"\bby \([^)]*\ble\b", expr), (
                    f"panel {title!r}: {series} outside histogram_quantile(.., sum by (le) ..)")


REQUIRED_PANELS = {
    # what the issue asks the dashboard to show -> a series that must be queried
    "coverage": "dhisparse_history_coverage_ratio",
    "host-fetch share": "dhisparse_host_fetch_share",
    "selected rows by source": "dhisparse_selected_rows_total",
    "pages by kind": "dhisparse_pages",
    "request slots": "dhisparse_request_slots",
    "admission wait": "dhisparse_admission_wait_seconds_bucket",
    "TTFT": "dhisparse_ttft_seconds_bucket",
    "TPOT": "dhisparse_tpot_seconds_bucket",
    "speculative tokens per round": "dhisparse_spec_emitted_tokens_per_round_bucket",
    "output tokens/s": "dhisparse_output_tokens_total",
    "kvstore bytes": "dhisparse_kvstore_bytes",
}


def test_dashboard_has_the_required_panels() -> None:
    used = {s for _, e in c.dashboard_queries(c.dashboard()) for s in c.series_in(e)}
    missing = {what: s for what, s in REQUIRED_PANELS.items() if s not in used}
    assert not missing, f"dashboard lacks panels for {missing}"
    ids = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            ids.append(p["id"])
            walk(p.get("panels", []))

    walk(c.dashboard()["panels"])
    assert len(ids) == len(set(ids)), "duplicate panel ids"


def _design_md() -> Path | None:
    for p in (c.REPO.parent / "shared" / "DESIGN.md", c.REPO / "DESIGN.md",
              c.REPO / "docs" / "DESIGN.md"):
        if p.is_file():
            return p
    return None


def test_section5_table_matches_design_md() -> None:
    path = _design_md()
    if path is None:
        pytest.skip("DESIGN.md is not beside this checkout; the §5 list is hardcoded in "
                    "tests/deploy/contract.py")
    text = path.read_text()
    m = re.search(r"^## 5\..*?$(.*?)^## ", text, re.S | re.M)
    assert m, f"{path}: no '## 5.' section"
    entries = re.findall(r"`(dhisparse_[a-z0-9_]+)(?:\{([^}]*)\})?`", m.group(1))
    design = {}
    for name, labels in entries:
        design[name] = {k: frozenset(v.split("|")) for k, v in
                        (kv.split("=") for kv in labels.split(",") if kv)} if labels else {}
    ours = {n: labels for n, (_, labels) in c.SECTION5.items()}
    assert design == ours, "tests/deploy/contract.py SECTION5 drifted from DESIGN.md §5"
