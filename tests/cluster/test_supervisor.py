"""The supervisor: restarts children that die, logs to files, and a killed supervisor
takes its children with it (parent-death signal armed by services.cli.launch)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from services.cli.supervisor import ProcessSpec, Supervisor

pytestmark = pytest.mark.integration

SLEEPER = [sys.executable, "-c", "import time, os; print('child', os.getpid(), flush=True); "
                                 "time.sleep(60)"]


def _wait(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_killed_child_is_restarted_and_logs_append(tmp_path) -> None:
    with Supervisor([ProcessSpec("s", SLEEPER, port=0)], tmp_path, backoff_s=0.05) as sup:
        first = sup.pid("s")
        assert _wait(lambda: "child" in (tmp_path / "s.log").read_text())
        sup.kill("s")
        assert _wait(lambda: sup.restarts("s") == 1 and sup.alive("s"))
        assert sup.pid("s") != first
        assert _wait(lambda: not _alive(first))
        assert _wait(lambda: (tmp_path / "s.log").read_text().count("child") == 2)
    assert not _alive(sup.pid("s"))


def test_children_die_with_a_killed_supervisor(tmp_path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from services.cli.supervisor import ProcessSpec, Supervisor
        sup = Supervisor([ProcessSpec("s", {SLEEPER!r}, port=0)], Path({str(tmp_path)!r}))
        sup.start()
        print(sup.pid("s"), flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert _wait(lambda: "child" in (tmp_path / "s.log").read_text())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    assert _wait(lambda: not _alive(child)), "child outlived its supervisor"


def test_a_child_that_keeps_dying_is_restarted_ever_more_slowly(tmp_path) -> None:
    """Deaths in a row double the wait (0.05, 0.1, 0.2, ... s): a child that cannot start
    is not respawned in a tight loop, and the supervisor answers meanwhile."""
    crash = [sys.executable, "-c", "import sys; sys.exit(3)"]
    with Supervisor([ProcessSpec("c", crash, port=0)], tmp_path, backoff_s=0.05) as sup:
        t0, slowest = time.monotonic(), 0.0
        while time.monotonic() - t0 < 2.5:
            t = time.monotonic()
            sup.alive("c")
            slowest = max(slowest, time.monotonic() - t)
            time.sleep(0.02)
        restarts = sup.restarts("c")
    assert 2 <= restarts <= 7, restarts  # a fixed 0.05 s wait gives ~15 or more
    assert slowest < 0.2, slowest          # no wait is spent holding the lock
