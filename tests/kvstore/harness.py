"""Real kvstore processes for tests: start, kill -9, restart on the same port."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from services.kvstore.store import StoreOptions

REPO = Path(__file__).resolve().parents[2]
SHM = Path("/dev/shm")


class Clock:
    """A store clock the test moves by hand (``now`` in wall-clock seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def options(prefix: str, capacity: int = 1 << 20, **kw: object) -> StoreOptions:
    """In-process store options of ``prefix`` in /dev/shm."""
    return StoreOptions(capacity=capacity, shm_dir=SHM, prefix=prefix,
                        manifest_dir=SHM / f"{prefix}.manifest", **kw)  # type: ignore[arg-type]


def unique_prefix(tag: str = "t") -> str:
    return f"kvt-{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def segments(prefix: str) -> list[Path]:
    """Segment files of a store prefix (not its manifest directory)."""
    return sorted(p for p in SHM.glob(f"{prefix}-*") if len(p.name) == len(prefix) + 33)


def remove_store_files(prefix: str) -> None:
    for p in segments(prefix):
        p.unlink(missing_ok=True)
    shutil.rmtree(SHM / f"{prefix}.manifest", ignore_errors=True)


class StoreProcess:
    """``python -m services.kvstore`` in a subprocess; ``target`` is its address."""

    def __init__(self, prefix: str, workdir: Path, *args: str, capacity: str = "256MiB"
                 ) -> None:
        self.prefix = prefix
        self.workdir = workdir
        self.args = ["--prefix", prefix, "--capacity", capacity, *args]
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / f"{prefix}.log"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> StoreProcess:
        port_file = self.workdir / f"{self.prefix}.port"
        port_file.unlink(missing_ok=True)
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path}
        env = {k: v for k, v in env.items() if not k.startswith("DHISPARSE_")}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services.kvstore", "--port", str(self.port),
                 "--port-file", str(port_file), *self.args],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not port_file.exists() or not port_file.read_text().strip():
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvstore exited {self.proc.returncode}:\n"
                                   + self.log.read_text()[-3000:])
            if time.monotonic() > deadline:
                raise TimeoutError(f"kvstore did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.02)
        self.port = int(port_file.read_text())
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill9()
            return -9


def assert_no_segments(prefix: str) -> None:
    """Nothing of ``prefix`` is left in /dev/shm but its (empty) manifest: no memory leaked."""
    left = segments(prefix)
    assert not left, f"leaked segments: {left}"
    manifest = Path("/dev/shm") / f"{prefix}.manifest"
    assert not manifest.exists() or not any(manifest.iterdir())


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gated_allocation(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """Make the store's ``Segment.create`` block until ``gate`` is set (``entered`` once it
    was called): an open held while it allocates its segment outside the store lock."""
    from services.kvstore import store as store_mod

    gate, entered = threading.Event(), threading.Event()
    create = store_mod.Segment.create

    def slow_create(path, size, preallocate=True):
        entered.set()
        assert gate.wait(10)
        return create(path, size, preallocate)

    monkeypatch.setattr(store_mod.Segment, "create", slow_create)
    return gate, entered
