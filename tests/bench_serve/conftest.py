"""A runner for the ``dhisparse bench`` CLI as a real process (the repository conftest
already pins one torch intra-op thread per test, as the CLI runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.Popen:
    """``python -m services.cli.main bench <args>`` started in the repository root."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, "-m", "services.cli.main", "bench", *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
