"""The drop-in resolver (``kernels.resolver``) against the torch reference of
``services.decode.hierarchy`` on the same GPU and group shape."""

from __future__ import annotations

import time

import torch

from bench.common import summarize


def run_vs_reference(rec: dict, reps: int = 5) -> None:
    """Drop-in ``kernels.resolver.resolve`` + ``apply_copies`` against the torch reference on
    the same GPU and group shape (8 requests of 20K rows, 656 B, B 4096, top_k 2048, all
    misses); host wall time per call, both synchronized (the reference syncs anyway)."""
    from kernels import dropin as kres
    from services.decode import hierarchy as hier

    bs, S, k, B, item = 8, 20_000, 2048, 4096, 656
    impls = {
        "torch_reference": (hier.resolve, hier.apply_copies),
        "cuda_kernels": (kres.resolve, kres.apply_copies),
    }
    out = {}
    for name, (resolve, apply) in impls.items():
        cfg = hier.HierarchyConfig(
            num_pages=bs * (B // 64 + 2) + 8,
            page_rows=64,
            hot_slots=B,
            tail_rows=72,
            max_requests=bs,
            policy="hisparse",
            device="cuda",
        )
        prov = hier.InProcessBackingProvider(pin=True)
        g = hier.SourceGroup(hier.SourceSpec("bench", item, 1), cfg, provider=prov)
        gen = torch.Generator().manual_seed(0)
        rids = [f"r{r}" for r in range(bs)]
        for rid in rids:
            backing = prov.open(rid, 0, item, S)
            backing.write(0, torch.randint(0, 256, (S, item), dtype=torch.uint8, generator=gen))
            backing.commit(0, S)
            hier.admit(g, rid, S, imported_rows=S)
        lo = g.request(rids[0]).tail_lo
        vis = torch.full((bs, 1), S, dtype=torch.int64, device="cuda")
        ts = []
        for _ in range(reps + 1):
            sel = torch.stack([torch.randperm(lo, generator=gen)[:k] for _ in rids])[:, None, :].to(
                "cuda"
            )
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            plan = resolve(g, rids, sel, vis)
            apply(g, plan, 0)
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t0) * 1e6)
            g.readers_finished()
        out[name] = {"wall_us": summarize(ts[1:]), "copies": int(plan.copy_rows.numel())}
    out["speedup"] = (
        out["torch_reference"]["wall_us"]["median"] / out["cuda_kernels"]["wall_us"]["median"]
    )
    rec["vs_torch_reference"] = {
        "batch": bs,
        "rows": S,
        "top_k": k,
        "hot": B,
        "item_bytes": item,
        **out,
    }
    print(
        "drop-in resolve+apply (host wall, synced): "
        f"torch {out['torch_reference']['wall_us']['median']:.0f} us, "
        f"kernels {out['cuda_kernels']['wall_us']['median']:.0f} us ({out['speedup']:.1f}x)",
        flush=True,
    )
