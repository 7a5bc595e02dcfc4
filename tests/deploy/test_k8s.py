"""Static checks of deploy/k8s (no cluster): kinds, flags, ports, probes, Services, the
ServiceMonitor, the decode GPU and worker id, and the node-local kvstore shm."""

from __future__ import annotations

import re
from typing import Any

from tests.deploy import contract as c


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
    targets = c.scrape_targets()
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
            c.assert_env_is_flag(origin, e["name"], inv.sub)
        for ef in cont.get("envFrom", []):
            if ef.get("configMapRef", {}).get("name") == cm["metadata"]["name"]:
                for var in cm["data"]:
                    c.assert_env_is_flag(f"{origin} (ConfigMap)", var, inv.sub)
