"""The CLI side of the deploy contract: every service command that docker-compose.yml and
deploy/k8s run exists in ``dhisparse`` and accepts every flag they pass.

These fail until the service CLIs (``services/<service>/cli.py:command``) land with the
flags of tests/deploy/contract.py — that is the contract they have to satisfy.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import pytest

from tests.deploy import contract as c


def _deploy_flags(sub: str) -> dict[str, set[str]]:
    """flag -> the deploy files passing it, for one service subcommand."""
    out: dict[str, set[str]] = {}
    for inv in c.deploy_invocations():
        if inv.sub == sub:
            for flag, _ in inv.flags:
                out.setdefault(flag, set()).add(inv.origin)
    return out


def _help(sub: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "240", "TERM": "dumb", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "services.cli.main", sub, "--help"],
                          cwd=c.REPO, env=env, capture_output=True, text=True, timeout=120)


def test_deploy_files_run_every_service() -> None:
    assert {inv.sub for inv in c.compose_invocations()} == set(c.SERVICES)
    assert {inv.sub for inv in c.k8s_invocations()} == set(c.SERVICES)


@pytest.mark.parametrize("sub", c.SERVICES)
def test_service_help_lists_every_flag_the_deploy_files_pass(sub: str) -> None:
    flags = _deploy_flags(sub)
    assert flags, f"no deploy file runs `dhisparse {sub}`"
    proc = _help(sub)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, (
        f"CONTRACT: `dhisparse {sub} --help` (python -m services.cli.main {sub} --help) must "
        f"succeed; it exited {proc.returncode}:\n{out[-3000:]}")
    assert "not implemented yet" not in out, (
        f"CONTRACT: `dhisparse {sub}` is still the CLI placeholder; docker-compose.yml and "
        f"deploy/k8s run it with {sorted(flags)}")
    missing = {f: sorted(origins) for f, origins in flags.items()
               if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", out)}
    assert not missing, (
        f"CONTRACT: `dhisparse {sub} --help` does not list flags the deploy files pass: "
        f"{missing}\n--help said:\n{out[-3000:]}")


# --------------------------------------------------------------------------- starts locally


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Service:
    """One `dhisparse <sub>` process started with a deploy file's flags, made local."""

    def __init__(self, sub: str, flags: list[tuple[str, str | None]], log: Any) -> None:
        self.sub = sub
        self.port, self.metrics_port = _free_port(), _free_port()
        self.log_path = log
        argv = [sys.executable, "-m", "services.cli.main", sub]
        for flag, value in flags:
            argv += [flag] if value is None else [flag, value]
        self.argv = argv
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, local: dict[str, str]) -> _Service:
        local = {"--host": "127.0.0.1", "--port": str(self.port),
                 "--metrics-port": str(self.metrics_port), **local}
        argv = list(self.argv)
        for i, token in enumerate(argv[:-1]):
            if token in local:
                argv[i + 1] = local[token]
        self.argv = argv
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, cwd=c.REPO, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        return self

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def wait_serving(self, timeout: float) -> None:
        import importlib.util
        import time

        spec = importlib.util.spec_from_file_location("hc", c.DEPLOY / "healthcheck.py")
        hc = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(hc)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"CONTRACT: `dhisparse {' '.join(self.argv[3:])}` (the deploy files' "
                    f"command, made local) exited {self.proc.returncode}:\n{self.tail()}")
            if hc.check(f"127.0.0.1:{self.port}", timeout=1.0):
                return
            time.sleep(0.3)
        raise AssertionError(f"`dhisparse {self.sub}` not SERVING after {timeout}s:\n"
                             f"{self.tail()}")

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def _deploy_invocation(sub: str) -> c.Invocation:
    """The k8s invocation (it passes every flag compose does, and --worker-id)."""
    return next(i for i in c.k8s_invocations() if i.sub == sub)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("sub", c.SERVICES)
def test_deploy_commands_start_locally_and_serve_health_and_metrics(
        sub: str, tmp_path: Any) -> None:
    """Each service, run with the flags the deploy files give it (addresses, ports, shm
    directory, capacity and device made local), reaches SERVING, serves /metrics and
    stops cleanly on SIGTERM."""
    import urllib.request

    shm = tmp_path / "shm"
    shm.mkdir()
    started: list[_Service] = []
    try:
        deps = {"kvstore": [], "residency": [], "decode": ["kvstore", "residency"]}[sub]
        local: dict[str, str] = {"--shm-dir": str(shm), "--capacity": "64MiB",
                                 "--device": "cpu", "--worker-id": "deploy-test-worker"}
        for name in [*deps, sub]:
            svc = _Service(name, _deploy_invocation(name).flags, tmp_path / f"{name}.log")
            started.append(svc.start(local))
            svc.wait_serving(timeout=240 if name == "decode" else 60)
            local[f"--{name}"] = f"127.0.0.1:{svc.port}"
        svc = started[-1]
        with urllib.request.urlopen(f"http://127.0.0.1:{svc.metrics_port}/metrics",
                                    timeout=10) as r:
            body = r.read().decode()
        assert r.status == 200 and "dhisparse_" in body, body[:2000]
    finally:
        codes = [(s.sub, s.stop()) for s in reversed(started)]
    assert all(code == 0 for _, code in codes), (
        f"services did not stop cleanly on SIGTERM: {codes}\n{started[-1].tail()}")
