"""Supervised child processes for ``dhisparse up`` (and the integration tests).

A :class:`Supervisor` starts each :class:`ProcessSpec` as its own process group, watches
them from one thread and restarts any that dies (with a small backoff), until
:meth:`Supervisor.stop` terminates them all (SIGTERM, then SIGKILL after a grace period).
Ports are fixed per spec, so a restarted service comes back at the same address.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from services.common.logging import get_logger

log = get_logger("supervisor")


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free right now (bound together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class _Spawned:
    """A child started with ``os.posix_spawn``: the ``Popen`` calls the supervisor uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.02)
        return code


def spawn(argv: list[str], env: dict[str, str], log_path: Path) -> _Spawned:
    """Start ``argv`` in a new session with stdout+stderr appended to ``log_path``.

    ``posix_spawn`` never runs fork handlers in the child (a plain fork of a process with
    live gRPC threads can abort before exec); ``services.cli.launch`` arms the
    parent-death signal and execs ``argv``."""
    launcher = [sys.executable, "-m", "services.cli.launch", str(os.getpid()), *argv]
    actions = [
        (os.POSIX_SPAWN_OPEN, 1, str(log_path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    pid = os.posix_spawn(sys.executable, launcher, env, file_actions=actions, setsid=True)
    return _Spawned(pid)


@dataclass(slots=True)
class ProcessSpec:
    name: str
    argv: list[str]
    port: int
    metrics_port: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    restart: bool = True


@dataclass(slots=True)
class _Child:
    spec: ProcessSpec
    proc: _Spawned
    log_path: Path
    restarts: int = 0
    started: float = field(default_factory=time.monotonic)
    quick_deaths: int = 0        # deaths in a row, each within STABLE_S of its start
    restart_at: float | None = None


STABLE_S = 10.0  # a child that ran this long counts as healthy: its next restart is quick


class Supervisor:
    """Start, watch and restart a set of processes; logs go to ``log_dir/<name>.log``."""

    def __init__(self, specs: Sequence[ProcessSpec], log_dir: Path,
                 backoff_s: float = 0.5, max_backoff_s: float = 30.0) -> None:
        """A dead child is restarted after ``backoff_s``, doubled for every death in a row
        that came within ``STABLE_S`` of its start, up to ``max_backoff_s``: a child that
        cannot start (port taken, bad configuration) is retried ever more slowly, not in a
        tight loop."""
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"process names must be unique, got {names}")
        self._specs = list(specs)
        self._log_dir = Path(log_dir)
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._children: dict[str, _Child] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        for spec in self._specs:
            self._children[spec.name] = self._spawn(spec, restarts=0)
        self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)
        self._thread.start()

    def _spawn(self, spec: ProcessSpec, restarts: int, quick_deaths: int = 0) -> _Child:
        log_path = self._log_dir / f"{spec.name}.log"
        env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1"}
        proc = spawn(spec.argv, env, log_path)
        log.info("started", extra={"fields": {"name": spec.name, "pid": proc.pid,
                                              "port": spec.port, "restarts": restarts}})
        return _Child(spec, proc, log_path, restarts, quick_deaths=quick_deaths)

    def _watch(self) -> None:
        while not self._stopping.wait(0.05):
            with self._lock:  # never held across a wait: a restart is due at restart_at
                now = time.monotonic()
                for name, child in list(self._children.items()):
                    code = child.proc.poll()
                    if code is None or not child.spec.restart or self._stopping.is_set():
                        continue
                    if child.restart_at is None:
                        quick = now - child.started < STABLE_S
                        child.quick_deaths = child.quick_deaths + 1 if quick else 0
                        delay = min(self._max_backoff_s,
                                    self._backoff_s * 2 ** max(0, child.quick_deaths - 1))
                        child.restart_at = now + delay
                        log.warning("process died; restarting", extra={"fields": {
                            "name": name, "exit_code": code, "in_s": round(delay, 2)}})
                    if now >= child.restart_at:
                        self._children[name] = self._spawn(child.spec, child.restarts + 1,
                                                           child.quick_deaths)

    def pid(self, name: str) -> int:
        with self._lock:
            return self._children[name].proc.pid

    def restarts(self, name: str) -> int:
        with self._lock:
            return self._children[name].restarts

    def set_restart(self, name: str, restart: bool) -> None:
        """Turn restarting of one child off (a dead child then stays dead) or back on (the
        watcher restarts it if it is dead)."""
        with self._lock:
            self._children[name].spec.restart = restart

    def alive(self, name: str) -> bool:
        with self._lock:
            return self._children[name].proc.poll() is None

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to one child (tests use SIGKILL); returns the pid signalled."""
        with self._lock:
            proc = self._children[name].proc
        os.killpg(proc.pid, sig)
        return proc.pid

    def stop(self, grace_s: float = 5.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            children = list(self._children.values())
        for child in children:
            if child.proc.poll() is None:
                os.killpg(child.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in children:
            try:
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()

    def __enter__(self) -> Supervisor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_healthy(port: int, timeout_s: float = 60.0, host: str = "127.0.0.1",
                 service: str = "") -> None:
    """Block until the gRPC health service on ``host:port`` answers SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with grpc.insecure_channel(f"{host}:{port}") as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=1.0)
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError as exc:
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"{host}:{port} not healthy after {timeout_s:.0f}s (last error: {last})")
