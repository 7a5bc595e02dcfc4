"""The resolver benchmark as a picture: ours beside the peer's two layouts, one panel per row
size and miss profile, with issue 7's targets dotted (bench/README.md "Resolver").

    python3 -m bench.resolver.plot bench/results/resolver_h200.json bench/results/resolver_h200.png

``merge_files`` (bench/resolver/peer.py) redraws it whenever the peer's cases are merged.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# (profile, panel title, what is drawn: µs per call or % of the pinned memcpy)
PROFILES = (
    ("hit100", "no misses: µs per call", "us"),
    ("miss2", "2% misses: µs per call", "us"),
    ("miss20", "20% misses: % of memcpy", "frac"),
    ("cold", "all misses: % of memcpy", "frac"),
)
# (label, peer layout or None for ours, matplotlib format)
SERIES = (("ours", None, "o-"), ("peer, scattered", "scattered", "s--"),
          ("peer, contiguous", "contiguous", "^--"))
FRAC_TARGET = {656: 75.0, 1152: 85.0}  # batch >= 32, 20% misses and cold
LATENCY_TARGETS = ((1, 32, 15.0), (160, 160, 20.0))  # batch range, µs (no misses)
COLD_BATCH1_GBPS = 25.0


def series(rec: dict, layout: str | None, item: int, top_k: int, profile: str,
           kind: str) -> tuple[list[int], list[float]]:
    """(batches, values) of one line: ours (layout None) or the peer's cases of ``layout``."""
    cases = rec["cases"] if layout is None else [
        c for c in rec.get("peer_cases", []) if c["layout"] == layout]
    pts = sorted(
        (c["batch"], c["us_per_call"] if kind == "us" else 100.0 * (c["frac_of_h2d_memcpy"] or 0))
        for c in cases
        if c["item_bytes"] == item and c["top_k"] == top_k and c["profile"] == profile
        and (kind == "us" or c.get("frac_of_h2d_memcpy") is not None)
    )
    return [b for b, _ in pts], [v for _, v in pts]


def plot(rec: dict, path: str | Path, top_k: int = 2048) -> Path:
    """Draw ``rec`` (a resolver JSON, the peer's cases merged or not) into the PNG ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = sorted({c["item_bytes"] for c in rec["cases"] if c["top_k"] == top_k})
    if not items:
        raise ValueError(f"no cases with top_k={top_k} to plot")
    fig, axes = plt.subplots(len(items), len(PROFILES), squeeze=False,
                             figsize=(4.0 * len(PROFILES), 3.3 * len(items)))
    memcpy = (rec.get("ceiling") or {}).get("h2d_pinned_1GiB_GBps")
    for i, item in enumerate(items):
        for j, (profile, title, kind) in enumerate(PROFILES):
            ax = axes[i][j]
            batches: set[int] = set()
            for label, layout, fmt in SERIES:
                x, y = series(rec, layout, item, top_k, profile, kind)
                if x:
                    ax.plot(x, y, fmt, label=label, ms=4)
                    batches.update(x)
            if profile == "hit100":
                for lo, hi, us in LATENCY_TARGETS:
                    ax.plot([lo, hi], [us, us], "k:", marker="_", ms=14, label=None)
            elif kind == "frac":
                ax.plot([32, 160], [FRAC_TARGET[item]] * 2, "k:", marker="_", ms=14)
                if profile == "cold" and memcpy:
                    ax.plot([1], [100.0 * COLD_BATCH1_GBPS / memcpy], "k_", ms=14)
                ax.set_ylim(0, 100)
            ax.set_xscale("log")
            ticks = sorted(batches) or [1]
            ax.set_xticks(ticks, [str(b) for b in ticks])
            ax.minorticks_off()
            ax.set_xlabel("batch")
            ax.set_title(f"{item} B rows, {title}", fontsize=9)
            ax.grid(alpha=0.3)
    axes[0][0].plot([], [], "k:", label="target (issue 7)")
    axes[0][0].legend(fontsize=7)
    sha = (rec.get("env") or {}).get("git_sha", "")
    fig.suptitle(f"fused resolver vs SGLang HiSparse, top_k {top_k}, H200 ({sha})", fontsize=10)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="a resolver JSON (bench/results/resolver_h200.json)")
    ap.add_argument("png", help="where the picture goes")
    ap.add_argument("--top-k", type=int, default=2048)
    a = ap.parse_args()
    print(plot(json.loads(Path(a.json).read_text()), a.png, a.top_k))


if __name__ == "__main__":
    main()
