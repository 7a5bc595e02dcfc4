"""Static checks of docker-compose.yml (no Docker): its services, commands, ports,
healthchecks, shared shm, builds and the Prometheus/Grafana mounts agree with the contract of
tests/deploy/contract.py."""

from __future__ import annotations

from typing import Any

from tests.deploy import contract as c


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
            c.assert_env_is_flag(f"docker-compose.yml:{name}", var, name)
