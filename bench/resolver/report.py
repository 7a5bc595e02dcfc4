"""Resolver benchmark results: the GB/s fit, per-case lines, the side-by-side table."""

from __future__ import annotations

import json

import numpy as np


def fit_gbps(points: list[tuple[float, float]]) -> dict:
    """Least squares us = a + bytes / (GB/s * 1e3) over (miss bytes, us) points."""
    if len(points) < 2:
        return {}
    x, y = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    slope, icpt = np.polyfit(x, y, 1)
    return {
        "GBps": 1e-3 / slope if slope > 0 else None,
        "intercept_us": float(icpt),
        "points": len(points),
    }


def print_case(r: dict) -> None:
    gb = f"{r['GBps']:6.1f}" if r.get("GBps") else "   -  "
    print(
        f"{r['item_bytes']:5d} k={r['top_k']:4d} bs={r['batch']:3d} {r['profile']:6s} "
        f"us={r['us_per_call']:8.1f} "
        f"GB/s={gb} wall={r['wall_us_median']:8.1f} ok={r['check']['ok']}",
        flush=True,
    )


def table(rec: dict) -> str:
    """Markdown table: ours beside the peer (same run), µs per call (GB/s of miss bytes)."""
    peer = {
        (c["layout"], c["item_bytes"], c["top_k"], c["batch"], c["profile"]): c
        for c in rec.get("peer_cases", [])
    }
    fmt = lambda c: (
        "-"
        if not c or c.get("us_per_call") is None
        else (f"{c['us_per_call']:.1f}" + (f" ({c['GBps']:.1f})" if c.get("GBps") else ""))
    )
    lines = [
        "| row B | top_k | batch | profile | ours µs (GB/s) | % memcpy | peer scattered "
        "| peer contiguous | speedup vs scattered |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in rec["cases"]:
        key = (c["item_bytes"], c["top_k"], c["batch"], c["profile"])
        ps, pc = peer.get(("scattered", *key)), peer.get(("contiguous", *key))
        frac = f"{100 * c['frac_of_h2d_memcpy']:.0f}%" if c.get("frac_of_h2d_memcpy") else "-"
        sp = f"{ps['us_per_call'] / c['us_per_call']:.1f}x" if ps and ps.get("us_per_call") else "-"
        lines.append(
            f"| {c['item_bytes']} | {c['top_k']} | {c['batch']} | {c['profile']} | {fmt(c)} "
            f"| {frac} | "
            f"{fmt(ps)} | {fmt(pc)} | {sp} |"
        )
    return "\n".join(lines)


def print_md(text: str) -> None:
    """A markdown table on the terminal: drawn by rich where it is installed, else as text."""
    try:
        from rich.console import Console
        from rich.markdown import Markdown

        Console(width=160).print(Markdown(text))
    except ImportError:
        print(text)


def print_table(rec: dict) -> None:
    print_md(rec["table_md"])
    print(json.dumps({k: rec.get(k) for k in ("ceiling", "fit", "peer_ceiling")}, default=str))
    k8 = rec.get("k8_identical")
    if k8 and "skipped" in k8:
        print(f"K = 8 identical: skipped ({k8['skipped']})")
    elif k8:
        print(
            f"K8/K1 = {k8['ratio_K8_over_K1']:.2f}; "
            f"copies K1={k8['K1']['copies']} K8={k8['K8']['copies']}"
        )
