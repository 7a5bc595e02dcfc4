"""``python -m services.cli.launch PARENT_PID CMD...``: exec CMD after asking the kernel to
SIGTERM it when its supervisor dies (even by SIGKILL), so a killed ``dhisparse up`` leaves
no orphaned services behind (Linux; elsewhere it just execs).

The supervisor starts children with ``os.posix_spawn`` (no fork of a process that may be
running gRPC threads: gRPC's fork handlers can abort such a child before it execs), so the
parent-death signal is armed here, in a fresh interpreter, instead of in a preexec hook.
"""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit("usage: python -m services.cli.launch PARENT_PID CMD [ARGS...]")
    parent, command = int(argv[0]), argv[1:]
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the supervisor died before the signal was armed
        sys.exit(1)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
