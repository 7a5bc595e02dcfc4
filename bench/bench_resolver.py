"""Resolver benchmark: the fused CUDA resolver on SGLang HiSparse's setup, beside the peer.

Setup (the peer's, ../shared/peers/sglang-hisparse): rows of 656 and 1152 bytes, top_k
2048 and 512 with B = 4096 hot slots, requests of 100K rows, batch 1/8/32/160,
0% / 2% / 20% / 100% (cold) misses. Host rows: one page-locked, mapped pool of
160 x 100K x 1152 B = 18.4 GB; request r's history is rows [r*S, (r+1)*S) of it (the
kvstore keeps one contiguous history per request, i.e. the peer's "contiguous" layout;
the selected rows of a batch are scattered over the whole pool). Every call of a case
takes the next m never-read rows of each request (no host row is re-read, so L2 and the
translation caches cannot serve it), L2 is flushed before each timing, and a pinned
host->device memcpy is measured in the same run. Timed: both launches of the sync-free
path (lookup, then commit + miss copies of one payload layer), CUDA events around them.
Correctness (locations, bytes, resident rows, copy count) is checked before timing.


The pieces live in ``bench/resolver/`` (see its ``__init__``); this module is the entry point.

Run: ``dhisparse bench resolver`` (or ``python -m bench.bench_resolver``).
"""

from __future__ import annotations

import os

import torch

from bench.common import environment, write_json
from bench.resolver.case import Case
from bench.resolver.peer import merge_files, merge_peer, run_peer
from bench.resolver.pool import (
    PAGE_ROWS,
    PROFILES,
    STAGING_ROWS,
    TAIL_ROWS,
    State,
    alloc_host,
    fill_random,
)
from bench.resolver.reference import run_vs_reference
from bench.resolver.report import fit_gbps, print_case, print_table, table
from bench.resolver.runs import (
    kres_select,
    run_blocks_sweep,
    run_copy_sweep,
    run_k8,
    run_ours,
)
from kernels.resolver_settings import COPY_TMA_DEFAULT
from kernels.resolver_settings import defines as kres_defines

__all__ = [
    "PAGE_ROWS",
    "PROFILES",
    "STAGING_ROWS",
    "TAIL_ROWS",
    "Case",
    "State",
    "alloc_host",
    "command",
    "fill_random",
    "fit_gbps",
    "kres_select",
    "merge_files",
    "merge_peer",
    "print_case",
    "print_table",
    "run_blocks_sweep",
    "run_copy_sweep",
    "run_k8",
    "run_ours",
    "run_peer",
    "run_vs_reference",
    "table",
]


def command(
    out: str = "bench/results/resolver_h200.json",
    items: str = "656,1152",
    configs: str = "2048:4096,512:4096",
    batches: str = "1,8,32,160",
    profiles: str = "hit100,miss2,miss20,cold",
    seq_len: int = 100_000,
    reps: int = 30,
    warmup: int = 5,
    wall_reps: int = 10,
    peer_dir: str = "",
    peer_out: str = "",
    peer_deadline_s: float = 200.0,
    peer_layouts: str = "scattered,contiguous",
    blocks_sweep: bool = True,
    copy_sweep: bool = True,
) -> None:
    """Fused resolver vs the memcpy ceiling and SGLang HiSparse's kernel (JSON + table)."""
    args = dict(locals())
    rec = {
        "what": "dhisparse fused resolver (kernels/resolver_*.cu), sync-free path: "
        "lookup + commit/copy",
        "env": environment()
        | {
            "victim_select": kres_select(),
            "lookup_blocks": os.environ.get("DHISPARSE_LOOKUP_BLOCKS", "auto"),
            "lookup_hits": os.environ.get("DHISPARSE_LOOKUP_HITS", "auto"),
            "copy_blocks": os.environ.get("DHISPARSE_COPY_BLOCKS", "auto"),
            "pdl": os.environ.get("DHISPARSE_PDL", "1"),
            "copy_early": os.environ.get("DHISPARSE_COPY_EARLY", "1"),
            "copy_tma": os.environ.get("DHISPARSE_COPY_TMA", COPY_TMA_DEFAULT),
            "defines": list(kres_defines()),  # the kernels' build (e.g. the TMA preload)
        },
        "setup": {k: v for k, v in args.items() if k != "out"},
        "cases": [],
    }
    run_ours(args, rec)
    write_json(out, rec)
    try:
        run_vs_reference(rec)
    except Exception as exc:  # recorded, the main table still counts
        rec["vs_torch_reference"] = {"error": f"{type(exc).__name__}: {exc}"}
    write_json(out, rec)
    if peer_dir:
        torch.cuda.empty_cache()
        run_peer(args, rec)
    rec["table_md"] = table(rec)
    write_json(out, rec)
    print_table(rec)


if __name__ == "__main__":
    import typer

    typer.run(command)
