"""20%-miss copies against how far apart the missed rows lie in host memory: the plain
address-sorted gather (``bench.bench_host_gather``) and the resolver (``bench.bench_resolver``,
profile miss20, top_k 2048), each on a kvstore segment of its own, at several request lengths
with the same 410 missed rows a request (bench/README.md "Runs 158-160").
``bench/run_h200_spacing.sh`` writes ``gather_<S>.json`` and ``res_<S>.json`` per request
length S; this merges them into one JSON, a table and a picture:

    python3 -m bench.resolver.spacing DIR bench/results/row_spacing_h200.json

Each side's % is of the memcpy its own process measured (the gather: from its pool; the
resolver: the faster of two 1 GiB copies), 55.4-55.5 GB/s in run 160.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from bench.resolver.plot import FRAC_TARGET

TOP_K = 2048  # the resolver cases taken: the peer's setup, 410 rows a request at 20%
GATHER_MODE = "shm"  # the gather's allocation taken where a file holds several


def spacing_kib(seq_len: int, rows: int, row_bytes: int) -> float:
    """Mean host bytes (KiB) from one missed row to the next in a request's region."""
    return seq_len * row_bytes / rows / 1024


def gather_points(rec: dict) -> tuple[str | None, list[dict]]:
    """(mode, points): the gather's regions x rows patterns at their best grid (copy.cu's
    kernel, address order region after region, its last row checked), % of the pool's
    memcpy, from one allocation mode (GATHER_MODE where present, else the first)."""
    rows = [r for r in rec["rows"] if "error" not in r and r.get("last_row_equal", True)
            and r.get("variant") in (None, "", "copy.cu") and not r.get("order")
            and not r.get("whole_pool")]
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    mode = GATHER_MODE if GATHER_MODE in modes else (modes[0] if modes else None)
    best: dict[tuple[int, int], dict] = {}
    for r in rows:
        key = (r["regions"], r["rows"])
        if r["mode"] == mode and (key not in best or r["us"] < best[key]["us"]):
            best[key] = r
    return mode, [dict(batch=reg, rows=n, us=r["us"], gbps=r["gbps"], grid=r["grid"],
                       pct=100.0 * r["of_memcpy"]) for (reg, n), r in sorted(best.items())]


def resolver_points(rec: dict, row_bytes: int) -> list[dict]:
    """The resolver's checked miss20 cases of ``row_bytes`` rows at TOP_K: median µs, GB/s
    of unique missed bytes, % of memcpy."""
    return [dict(batch=c["batch"], rows=c["unique_miss_rows"] // c["batch"],
                 us=c["us"]["median"], p10=c["us"]["p10"], p90=c["us"]["p90"],
                 gbps=c["GBps"], pct=100.0 * c["frac_of_h2d_memcpy"])
            for c in rec["cases"]
            if c["profile"] == "miss20" and c["item_bytes"] == row_bytes and c["top_k"] == TOP_K
            and "GBps" in c and c.get("check", {}).get("ok", True)]


def row_size(gather: dict | None, res: dict | None, path: Path) -> int:
    """The length's row bytes: the gather's, else the resolver's one item size."""
    if gather is not None:
        return int(gather["setup"]["row_bytes"])
    sizes = sorted({c["item_bytes"] for c in res["cases"]})
    if len(sizes) != 1:
        raise ValueError(f"{path.name}: item sizes {sizes} and no gather file to choose one")
    return sizes[0]


def merge(folder: Path) -> dict:
    """Every request length's gather and resolver files in ``folder`` as one record."""
    lengths = sorted({int(m.group(1)) for p in folder.glob("*.json")
                      if (m := re.fullmatch(r"(?:gather|res)_(\d+)\.json", p.name))},
                     reverse=True)
    if not lengths:
        raise FileNotFoundError(f"folder={folder}: no gather_<S>.json or res_<S>.json in it")
    out: dict = {"what": __doc__.split("\n\n")[0], "lengths": []}
    for s in lengths:
        gpath, rpath = folder / f"gather_{s}.json", folder / f"res_{s}.json"
        gather = json.loads(gpath.read_text()) if gpath.exists() else None
        res = json.loads(rpath.read_text()) if rpath.exists() else None
        entry: dict = {"seq_len": s, "row_bytes": row_size(gather, res, rpath)}
        if gather is not None:
            entry["gather_mode"], entry["gather"] = gather_points(gather)
            entry["env"] = gather.get("env")
        if res is not None:
            entry["resolver"] = resolver_points(res, entry["row_bytes"])
            entry["memcpy_gbps"] = res["ceiling"]["h2d_pinned_1GiB_GBps"]
            entry.setdefault("env", res.get("env"))
        for p in entry.get("gather", []) + entry.get("resolver", []):
            p["spacing_kib"] = round(spacing_kib(s, p["rows"], entry["row_bytes"]), 1)
        out["lengths"].append(entry)
    out["table_md"] = table(out)
    return out


def table(rec: dict) -> str:
    """One line per (request length, batch, rows a request) either side measured: gather and
    resolver side by side, "-" where one side has no point."""
    lines = ["| rows a request | spacing (KiB) | batch | gather GB/s (% memcpy) | "
             "resolver µs (GB/s, % memcpy) | resolver / gather |", "|---|---|---|---|---|---|"]
    for e in rec["lengths"]:
        gat = {(p["batch"], p["rows"]): p for p in e.get("gather", [])}
        res = {(p["batch"], p["rows"]): p for p in e.get("resolver", [])}
        for key in sorted(gat.keys() | res.keys()):
            g, r = gat.get(key), res.get(key)
            gtxt = f"{g['gbps']:.1f} ({g['pct']:.0f}%)" if g else "-"
            rtxt = f"{r['us']:.1f} ({r['gbps']:.1f}, {r['pct']:.0f}%)" if r else "-"
            ratio = f"{r['gbps'] / g['gbps']:.2f}" if g and r else "-"
            lines.append(f"| {e['seq_len']} | {(g or r)['spacing_kib']:.0f} | {key[0]} | {gtxt} | "
                         f"{rtxt} | {ratio} |")
    return "\n".join(lines)


def plot(rec: dict, png: Path) -> None:
    """% of memcpy against row spacing, the gather and the resolver per batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    res_pts = [p for e in rec["lengths"] for p in e.get("resolver", [])]
    ours = {(p["batch"], p["rows"]) for p in res_pts}
    for b in sorted({b for b, _ in ours}):
        for kind, fmt in (("gather", "s--"), ("resolver", "o-")):
            pts = sorted((p["spacing_kib"], p["pct"]) for e in rec["lengths"]
                         for p in e.get(kind, []) if (p["batch"], p["rows"]) in ours
                         and p["batch"] == b)
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], fmt, label=f"{kind}, batch {b}")
    sizes = {e.get("row_bytes") for e in rec["lengths"]}
    for size in sizes & set(FRAC_TARGET):
        ax.axhline(FRAC_TARGET[size], color="grey", ls=":", label=f"target, {size} B rows")
    ax.set_xscale("log")
    ticks = sorted({p["spacing_kib"] for p in res_pts})
    ax.set_xticks(ticks, [f"{t:.0f}" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("mean distance between a request's missed rows (KiB, log)")
    ax.set_ylabel("% of the pinned memcpy (each side's own)")
    per_request = sorted({n for _, n in ours})
    ax.set_title(f"20% misses, {'/'.join(str(s) for s in sorted(sizes))} B rows, "
                 f"{'/'.join(str(n) for n in per_request)} a request")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("out", type=Path)
    a = ap.parse_args()
    rec = merge(a.folder)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(rec, indent=1, default=str))
    plot(rec, a.out.with_suffix(".png"))
    print(rec["table_md"])


if __name__ == "__main__":
    main()
