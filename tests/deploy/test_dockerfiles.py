"""The Dockerfiles (CPU and GPU images, healthcheck, shared uid) and deploy/healthcheck.py
against a real gRPC health server."""

from __future__ import annotations

import importlib.util
import re
import socket
from typing import Any

import pytest

from tests.deploy import contract as c

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
