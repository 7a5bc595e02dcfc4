"""Static checks of the deployment files (no Docker, no cluster): docker-compose.yml,
deploy/prometheus.yml, the Grafana provisioning and dashboard, deploy/k8s and the
Dockerfiles agree with each other and with the port / flag / metric contract of
tests/deploy/contract.py."""

from __future__ import annotations

import importlib
import importlib.util
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.deploy import contract as c

# =========================================================================== compose


def test_compose_parses_and_has_the_five_services() -> None:
    services = c.compose()["services"]
    assert set(services) == {"kvstore", "residency", "decode", "prometheus", "grafana"}


def test_compose_commands_run_known_dhisparse_services_with_known_flags() -> None:
    services = c.compose()["services"]
    invs = {inv.origin.split(":")[1]: inv for inv in c.compose_invocations()}
    for name in c.SERVICES:
        assert name in invs, f"compose service {name} has no `command:`"
        assert invs[name].sub == name, f"compose service {name} runs `dhisparse {invs[name].sub}`"
    for name, svc in services.items():
        if name not in c.SERVICES:
            assert "command" not in svc, f"{name}: only dhisparse services set a command"
    for inv in invs.values():
        unknown = {f for f, _ in inv.flags} - c.KNOWN_FLAGS[inv.sub]
        assert not unknown, f"{inv.origin}: flags {sorted(unknown)} are not in the contract"
        assert inv.value("--host") == "0.0.0.0", f"{inv.origin}: containers bind 0.0.0.0"


def test_compose_ports_follow_the_contract() -> None:
    services = c.compose()["services"]
    for inv in c.compose_invocations():
        grpc, metrics = c.PORTS[inv.sub]
        assert inv.value("--port") == str(grpc), inv.origin
        assert inv.value("--metrics-port") == str(metrics), inv.origin
        hc = services[inv.sub]["healthcheck"]["test"]
        assert hc[0] == "CMD" and "/usr/local/bin/dhisparse-healthcheck" in hc, (
            f"{inv.origin}: healthcheck must run dhisparse-healthcheck: {hc}")
        assert hc[-1] == f"127.0.0.1:{grpc}", f"{inv.origin}: healthcheck probes {hc[-1]}"


def test_compose_decode_scales_and_reserves_a_gpu() -> None:
    decode = c.compose()["services"]["decode"]
    assert "container_name" not in decode, "a fixed container_name breaks --scale decode=N"
    assert "hostname" not in decode, "a fixed hostname would give every replica one worker id"
    for p in decode.get("ports", []):
        if isinstance(p, dict):
            assert "published" not in p, f"decode publishes a fixed host port: {p}"
        else:
            assert ":" not in str(p), f"decode publishes a fixed host port: {p!r}"
    devices = decode["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and d.get("count") == 1
               and "gpu" in d.get("capabilities", []) for d in devices), devices
    inv = next(i for i in c.compose_invocations() if i.sub == "decode")
    assert inv.value("--device") == "cuda"
    assert inv.value("--worker-id") is None, (
        "compose cannot give replicas distinct ids: leave --worker-id to its hostname default")
    deps = decode.get("depends_on", {})
    assert {"kvstore", "residency"} <= set(deps), "decode must wait for kvstore and residency"


def _mount_source(mounts: list[Any], target: str) -> str | None:
    for m in mounts:
        if isinstance(m, dict):
            if m.get("target") == target:
                return m.get("source")
        else:
            parts = str(m).split(":")
            if len(parts) >= 2 and parts[1] == target:
                return parts[0]
    return None


def test_compose_decode_shares_the_kvstore_shm() -> None:
    doc = c.compose()
    kv, decode = doc["services"]["kvstore"], doc["services"]["decode"]
    kv_inv = next(i for i in c.compose_invocations() if i.sub == "kvstore")
    shm_dir = kv_inv.value("--shm-dir")
    assert shm_dir == "/dev/shm"
    if decode.get("ipc") == "service:kvstore":
        assert kv.get("ipc") == "shareable", "ipc: service:kvstore needs kvstore ipc: shareable"
        return
    kv_src = _mount_source(kv.get("volumes", []), shm_dir)
    dec_src = _mount_source(decode.get("volumes", []), shm_dir)
    assert kv_src and kv_src == dec_src, (
        f"kvstore ({kv_src}) and decode ({dec_src}) must mount the same volume at {shm_dir}")
    vol = doc["volumes"][kv_src]
    assert vol["driver_opts"]["type"] == "tmpfs", "the shared shm volume must be a tmpfs"
    assert "mode=1777" in vol["driver_opts"]["o"]


def test_compose_decode_reaches_kvstore_and_residency_by_service_name() -> None:
    invs = {i.sub: i for i in c.compose_invocations()}
    for flag, target in (("--kvstore", "kvstore"), ("--residency", "residency")):
        host, port = c.host_port(invs["decode"].value(flag) or "")
        assert host == target and port == c.PORTS[target][0], f"decode {flag} -> {host}:{port}"


def test_compose_builds_from_the_deploy_dockerfiles() -> None:
    services = c.compose()["services"]
    for name in c.SERVICES:
        build = services[name]["build"]
        dockerfile = c.REPO / build.get("context", ".") / build["dockerfile"]
        assert dockerfile.is_file(), f"{name}: {dockerfile} missing"
    assert services["decode"]["build"]["dockerfile"] == "deploy/Dockerfile.gpu"


def test_compose_prometheus_and_grafana_mount_the_provisioning() -> None:
    services = c.compose()["services"]
    prom = services["prometheus"]
    assert prom["image"].startswith("prom/prometheus")
    assert _mount_source(prom["volumes"], "/etc/prometheus/prometheus.yml") == \
        "./deploy/prometheus.yml"
    graf = services["grafana"]
    assert graf["image"].startswith("grafana/grafana")
    assert _mount_source(graf["volumes"], "/etc/grafana/provisioning") == \
        "./deploy/grafana/provisioning"
    # The dashboard provider's path must be where the dashboards directory is mounted.
    providers = c.load_yaml(c.GRAFANA_PROVISIONING / "dashboards" / "dhisparse.yml")["providers"]
    path = providers[0]["options"]["path"]
    assert _mount_source(graf["volumes"], path) == "./deploy/grafana/dashboards", (
        f"dashboard provider reads {path}, which compose does not mount")
    home = graf["environment"].get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    assert home is None or home == f"{path}/{c.DASHBOARD.name}"


def test_compose_env_vars_are_known_flags() -> None:
    for name in c.SERVICES:
        env = c.compose()["services"][name].get("environment", {})
        for var in env:
            _assert_env_is_flag(f"docker-compose.yml:{name}", var, name)


def _assert_env_is_flag(origin: str, var: str, sub: str) -> None:
    if not var.startswith("DHISPARSE_"):
        return
    flag = "--" + var.removeprefix("DHISPARSE_").lower().replace("_", "-")
    assert flag in c.KNOWN_FLAGS[sub], f"{origin}: {var} is not the env form of a {sub} flag"


# =========================================================================== prometheus


def _scrape_targets() -> dict[str, set[tuple[str, int]]]:
    """job -> {(host, port)} from static_configs and dns_sd_configs."""
    out: dict[str, set[tuple[str, int]]] = {}
    for job in c.prometheus()["scrape_configs"]:
        targets = out.setdefault(job["job_name"], set())
        for sc in job.get("static_configs", []):
            targets |= {c.host_port(t) for t in sc["targets"]}
        for dns in job.get("dns_sd_configs", []):
            assert dns.get("type", "SRV") == "A", "A records + port for compose DNS"
            targets |= {(n, int(dns["port"])) for n in dns["names"]}
    return out


def test_prometheus_scrapes_every_compose_service_on_its_metrics_port() -> None:
    targets = _scrape_targets()
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


# =========================================================================== real registries

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
    assert by_family or service == "residency", (
        f"{module.__name__} defines none of the §5 series")


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


# =========================================================================== kubernetes


def test_k8s_docs_parse_and_have_the_expected_kinds() -> None:
    docs = c.k8s_docs()
    kinds = {(d["kind"], d["metadata"]["name"]) for _, d in docs if "metadata" in d}
    expected = {
        ("Namespace", "dhisparse"), ("ConfigMap", "dhisparse-config"),
        ("DaemonSet", "kvstore"), ("Service", "kvstore"),
        ("Deployment", "residency"), ("Service", "residency"),
        ("Deployment", "decode"), ("Service", "decode"),
        ("ServiceMonitor", "dhisparse"),
    }
    assert expected <= kinds, f"missing {expected - kinds}"
    for fname, d in docs:
        assert "apiVersion" in d and "kind" in d, fname
        if d["kind"] == "ServiceMonitor":
            assert d["apiVersion"] == "monitoring.coreos.com/v1"
        if d["kind"] not in ("Namespace", "Kustomization"):
            assert d["metadata"].get("namespace") == "dhisparse", f"{fname}: {d['kind']}"
        if d["kind"] in c.WORKLOAD_KINDS:
            sel = d["spec"]["selector"]["matchLabels"]
            labels = d["spec"]["template"]["metadata"]["labels"]
            assert sel.items() <= labels.items(), f"{fname}: selector does not match pods"


def test_k8s_kustomization_lists_every_manifest() -> None:
    kust = c.load_yaml(c.K8S / "kustomization.yaml")
    files = {p.name for p in c.K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files


def test_k8s_containers_run_known_dhisparse_services_with_known_flags() -> None:
    subs = {}
    for (origin, w, cont), inv in zip(c.k8s_containers(), c.k8s_invocations(), strict=True):
        assert c.is_dhisparse_image(cont["image"]), f"{origin}: image {cont['image']}"
        unknown = {f for f, _ in inv.flags} - c.KNOWN_FLAGS[inv.sub]
        assert not unknown, f"{origin}: flags {sorted(unknown)} are not in the contract"
        assert inv.value("--host") == "0.0.0.0", origin
        subs[w["metadata"]["name"]] = (w["kind"], inv.sub)
    assert subs == {"kvstore": ("DaemonSet", "kvstore"),
                    "residency": ("Deployment", "residency"),
                    "decode": ("Deployment", "decode")}


def _container_port(cont: dict[str, Any], name: str) -> int:
    ports = {p["name"]: p["containerPort"] for p in cont.get("ports", [])}
    assert name in ports, f"container {cont['name']} has no port named {name}"
    return ports[name]


def test_k8s_ports_annotations_probes_match_the_contract_and_prometheus_yml() -> None:
    targets = _scrape_targets()
    for (origin, w, cont), inv in zip(c.k8s_containers(), c.k8s_invocations(), strict=True):
        grpc, metrics = c.PORTS[inv.sub]
        assert inv.value("--port") == str(grpc) == str(_container_port(cont, "grpc")), origin
        assert inv.value("--metrics-port") == str(metrics) == \
            str(_container_port(cont, "metrics")), origin
        ann = w["spec"]["template"]["metadata"].get("annotations", {})
        assert ann.get("prometheus.io/scrape") == "true", origin
        assert ann.get("prometheus.io/port") == str(metrics), origin
        assert ann.get("prometheus.io/path", "/metrics") == "/metrics", origin
        # the same metrics port compose's Prometheus scrapes for this job
        assert {p for _, p in targets[inv.sub]} == {metrics}, (origin, targets[inv.sub])
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            if probe in cont:
                assert cont[probe]["grpc"]["port"] == grpc, f"{origin}: {probe}"
        assert "readinessProbe" in cont, f"{origin}: no readinessProbe"


def _services() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in c.k8s_docs() if d["kind"] == "Service"}


def test_k8s_services_select_their_pods_and_expose_named_ports() -> None:
    services = _services()
    for _origin, w, cont in c.k8s_containers():
        name = w["metadata"]["name"]
        svc = services[name]
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert svc["spec"]["selector"].items() <= labels.items(), f"Service {name} selector"
        ports = {p["name"]: p for p in svc["spec"]["ports"]}
        for pname in ("grpc", "metrics"):
            assert ports[pname]["port"] == _container_port(cont, pname), f"Service {name}"
            assert ports[pname].get("targetPort") in (pname, _container_port(cont, pname))


def test_k8s_servicemonitor_scrapes_every_service_metrics_port() -> None:
    sm = next(d for _, d in c.k8s_docs() if d["kind"] == "ServiceMonitor")
    sel = sm["spec"]["selector"]["matchLabels"]
    port_names = {e["port"] for e in sm["spec"]["endpoints"]}
    assert "dhisparse" in sm["spec"]["namespaceSelector"]["matchNames"]
    for name in c.SERVICES:
        svc = _services()[name]
        assert sel.items() <= svc["metadata"]["labels"].items(), f"ServiceMonitor misses {name}"
        assert port_names <= {p["name"] for p in svc["spec"]["ports"]}, name


def test_k8s_decode_gets_a_gpu_and_its_pod_name_as_worker_id() -> None:
    (origin, _w, cont), inv = next(
        (x, i) for x, i in zip(c.k8s_containers(), c.k8s_invocations(), strict=True)
        if i.sub == "decode")
    res = cont["resources"]
    assert str(res["limits"]["nvidia.com/gpu"]) == "1", origin
    assert str(res.get("requests", {}).get("nvidia.com/gpu", "1")) == "1", origin
    wid = inv.value("--worker-id") or ""
    m = re.fullmatch(r"\$\((\w+)\)", wid)
    assert m, f"{origin}: --worker-id {wid!r} is not $(VAR)"
    env = {e["name"]: e for e in cont.get("env", [])}
    assert env[m.group(1)]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", origin
    assert inv.value("--device") == "cuda"


def test_k8s_decode_reaches_residency_and_the_node_local_kvstore() -> None:
    services = _services()
    inv = next(i for i in c.k8s_invocations() if i.sub == "decode")
    for flag, target in (("--kvstore", "kvstore"), ("--residency", "residency")):
        host, port = c.host_port(inv.value(flag) or "")
        assert host.split(".")[0] == target, f"decode {flag} {host}"
        assert port in {p["port"] for p in services[target]["spec"]["ports"]}
    assert services["kvstore"]["spec"].get("internalTrafficPolicy") == "Local", (
        "decode must only reach its own node's kvstore (its segments are node-local)")


def _shm_volume(w: dict[str, Any], cont: dict[str, Any], mount_path: str) -> dict[str, Any]:
    mounts = {m["mountPath"]: m["name"] for m in cont.get("volumeMounts", [])}
    assert mount_path in mounts, f"{cont['name']} does not mount {mount_path}"
    vols = {v["name"]: v for v in pod_spec_volumes(w)}
    return vols[mounts[mount_path]]


def pod_spec_volumes(w: dict[str, Any]) -> list[dict[str, Any]]:
    return c.pod_spec(w).get("volumes", [])


def test_k8s_kvstore_and_decode_share_the_node_shm_as_the_same_uid() -> None:
    pairs = {inv.sub: (w, cont, inv) for (_, w, cont), inv in
             zip(c.k8s_containers(), c.k8s_invocations(), strict=True)}
    kw, kc, kinv = pairs["kvstore"]
    dw, dc, _ = pairs["decode"]
    shm_dir = kinv.value("--shm-dir") or "/dev/shm"
    kv_vol, dec_vol = _shm_volume(kw, kc, shm_dir), _shm_volume(dw, dc, shm_dir)
    if c.pod_spec(kw).get("hostIPC") and c.pod_spec(dw).get("hostIPC"):
        return
    assert "hostPath" in kv_vol and "hostPath" in dec_vol, "share a hostPath (or hostIPC)"
    assert kv_vol["hostPath"]["path"] == dec_vol["hostPath"]["path"]
    for w in (kw, dw):
        sc = c.pod_spec(w).get("securityContext", {})
        assert sc.get("runAsUser") == c.UID, f"{w['metadata']['name']}: runAsUser"
    assert c.pod_spec(kw)["nodeSelector"] == c.pod_spec(dw)["nodeSelector"], (
        "the kvstore DaemonSet must cover every node decode workers land on")


def test_k8s_env_vars_are_known_flags() -> None:
    cm = next(d for _, d in c.k8s_docs() if d["kind"] == "ConfigMap")
    for origin, _, cont in c.k8s_containers():
        inv = next(i for i in c.k8s_invocations() if i.origin == origin)
        for e in cont.get("env", []):
            _assert_env_is_flag(origin, e["name"], inv.sub)
        for ef in cont.get("envFrom", []):
            if ef.get("configMapRef", {}).get("name") == cm["metadata"]["name"]:
                for var in cm["data"]:
                    _assert_env_is_flag(f"{origin} (ConfigMap)", var, inv.sub)


# =========================================================================== Dockerfiles


def _dockerfile(name: str) -> str:
    return (c.DEPLOY / name).read_text()


def test_cpu_dockerfile_pins_cpu_torch_and_installs_the_package() -> None:
    text = _dockerfile("Dockerfile")
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert re.search(r"TORCH_VERSION=2\.13\.0", text) and "download.pytorch.org/whl/cpu" in text
    assert re.search(r"pip install \.(\s|$)", text)


def test_gpu_dockerfile_uses_cuda13_and_the_gpu_extra() -> None:
    text = _dockerfile("Dockerfile.gpu")
    assert re.search(r"nvidia/cuda:13\.\d+\.\d+-runtime", text)
    assert 'pip install ".[gpu]"' in text
    assert "whl/cu13" in text


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.gpu"])
def test_dockerfiles_install_healthcheck_and_run_as_the_shared_uid(name: str) -> None:
    text = _dockerfile(name)
    assert "COPY deploy/healthcheck.py /usr/local/bin/dhisparse-healthcheck" in text
    assert f"USER {c.UID}" in text and f"--uid {c.UID}" in text
    for src in re.findall(r"^COPY (\S+) ", text, re.M):
        assert (c.REPO / src).exists(), f"{name}: COPY {src} does not exist"
    assert (c.DEPLOY / f"{name}.dockerignore").is_file()


# =========================================================================== healthcheck


def _load_healthcheck() -> Any:
    spec = importlib.util.spec_from_file_location("dhisparse_healthcheck",
                                                  c.DEPLOY / "healthcheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_healthcheck_script_follows_grpc_health() -> None:
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    hc = _load_healthcheck()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        addr = f"127.0.0.1:{port}"
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert hc.main(["hc", addr]) == 0
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert hc.main(["hc", addr]) == 1
        assert hc.main(["hc", addr, "dhisparse.v1.Unknown"]) == 1   # NOT_FOUND
    finally:
        server.stop(0)
    with socket.socket() as s:   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    assert hc.main(["hc", f"127.0.0.1:{closed}"]) == 1
