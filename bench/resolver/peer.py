"""SGLang HiSparse's harness, run in the same device call, and its cases merged beside ours."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from bench.common import write_json
from bench.resolver.plot import plot
from bench.resolver.report import table


def run_peer(args: dict, rec: dict) -> None:
    script = Path(args["peer_dir"]) / "bench_peer_hisparse.py"
    out = Path(args["peer_out"])
    cmd = [
        sys.executable,
        str(script),
        "--deadline-s",
        str(args["peer_deadline_s"]),
        "--out",
        str(out),
        "--reps",
        str(args["reps"]),
        "--wall-reps",
        "5",
        "--layouts",
        args["peer_layouts"],
    ]
    t0 = time.time()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=args["peer_deadline_s"] + 240
        )
        rec["peer_run"] = {
            "rc": proc.returncode,
            "s": round(time.time() - t0, 1),
            "tail": proc.stdout[-3000:] + proc.stderr[-3000:],
        }
    except subprocess.TimeoutExpired as exc:
        rec["peer_run"] = {
            "rc": "timeout",
            "s": round(time.time() - t0, 1),
            "tail": str(exc)[-2000:],
        }
    if out.exists():
        merge_peer(rec, json.loads(out.read_text()))


def merge_peer(rec: dict, peer: dict) -> None:
    """Put the peer harness's cases (run in the same device call) beside ours, for table()."""
    rec["peer_ceiling"] = peer.get("ceiling")
    rec["peer_cases"] = [
        {
            k: c.get(k)
            for k in (
                "layout",
                "item_bytes",
                "top_k",
                "batch",
                "profile",
                "us_per_call",
                "GBps",
                "frac_of_h2d_memcpy",
            )
        }
        | {"ok": c.get("check", {}).get("ok")}
        for c in peer.get("cases", [])
    ]
    rec["table_md"] = table(rec)


def merge_files(ours: str, peer: str, git_sha: str = "") -> None:
    """``python -m bench.bench_resolver merge OURS PEER``-style helper (called from Python):
    rewrite OURS with PEER's cases merged and the side-by-side table regenerated, and draw
    it beside OURS as a PNG (``bench.resolver.plot``)."""
    rec = json.loads(Path(ours).read_text())
    merge_peer(rec, json.loads(Path(peer).read_text()))
    if git_sha and rec.get("env", {}).get("git_sha") in (None, "unknown"):
        rec["env"]["git_sha"] = git_sha
        rec["env"]["git_sha_note"] = "filled in after the run (no .git on the device)"
    write_json(ours, rec)
    plot(rec, Path(ours).with_suffix(".png"))
