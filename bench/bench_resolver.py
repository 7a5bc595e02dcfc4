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

Run: ``dhisparse bench resolver`` (or ``python -m bench.bench_resolver``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import (
    Flusher,
    environment,
    h2d_memcpy_gbps,
    summarize,
    time_gpu,
    time_wall,
    write_json,
)

PROFILES = {"hit100": 0.0, "miss2": 0.02, "miss20": 0.20, "cold": 1.0}
PAGE_ROWS, TAIL_ROWS, STAGING_ROWS = 64, 72, 4096


def alloc_host(nbytes: int) -> tuple[torch.Tensor, str]:
    """Page-locked, mapped host pool (cudaHostRegister, like the kvstore's segments)."""
    t = torch.empty(nbytes, dtype=torch.uint8)
    rc = int(
        torch.cuda.cudart().cudaHostRegister(t.data_ptr(), nbytes, 2)
    )  # cudaHostRegisterMapped
    if rc == 0:
        return t, "cudaHostRegister(Mapped)"
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True), f"pin_memory (register rc={rc})"


def fill_random(host: torch.Tensor, dev: torch.device, chunk: int = 1 << 30) -> None:
    g = torch.empty(min(chunk, host.numel()), dtype=torch.uint8, device=dev)
    for off in range(0, host.numel(), chunk):
        n = min(chunk, host.numel() - off)
        g[:n].random_()
        host[off : off + n].copy_(g[:n])
    torch.cuda.synchronize()


class State:
    """Hot caches of P requests (one tensor per field, a row per request) and their tables."""

    def __init__(self, P: int, S: int, B: int, dev: torch.device) -> None:
        self.P, self.S, self.B = P, S, B
        self.tail_lo = (S - 1) // PAGE_ROWS * PAGE_ROWS  # rows below it go through steps 2-3
        order = torch.rand(P, self.tail_lo, device=dev).argsort(1)
        self.res, self.nonres = order[:, :B].contiguous(), order[:, B:].contiguous()
        self.cold_order = order  # cold: any row, call i takes window i
        self.hot_pick = torch.rand(P, B, device=dev).argsort(1)
        i64 = dict(dtype=torch.int64, device=dev)
        self.hot_rows = torch.empty(P, B, **i64)
        self.stamp = torch.empty(P, B, **i64)
        self.protect = torch.zeros(P, B, **i64)
        self.hot_locs = torch.arange(P * B, **i64).view(P, B)
        self.tail_locs = torch.arange(P * B, P * B + P * TAIL_ROWS, **i64).view(P, TAIL_ROWS)
        pages = -(-S // PAGE_ROWS)
        self.page_map = torch.full((P, pages), -1, **i64)
        self.page_ready = torch.zeros(P, pages, dtype=torch.bool, device=dev)
        self.stamp0 = torch.arange(1, B + 1, **i64).repeat(P, 1)  # LRU order = slot order
        self.stage_locs = torch.arange(
            P * B + P * TAIL_ROWS, P * B + P * TAIL_ROWS + STAGING_ROWS, **i64
        )
        self.pool_rows = P * B + P * TAIL_ROWS + STAGING_ROWS

    def table(self, bs: int) -> torch.Tensor:
        rows = [
            [
                t[r].data_ptr()
                for t in (
                    self.hot_rows,
                    self.stamp,
                    self.protect,
                    self.hot_locs,
                    self.tail_locs,
                    self.page_map,
                    self.page_ready,
                )
            ]
            + [self.tail_lo, self.S]
            for r in range(bs)
        ]
        return torch.tensor(rows, dtype=torch.int64, device=self.hot_rows.device)

    def restore(self, cold: bool) -> None:
        if cold:
            self.hot_rows.fill_(-1)
            self.stamp.zero_()
        else:
            self.hot_rows.copy_(self.res)
            self.stamp.copy_(self.stamp0)
        self.protect.zero_()

    def selection(self, bs: int, K: int, k: int, m: int, i: int, cold: bool) -> torch.Tensor:
        """[bs, K, k]: k - m resident rows + this call's window of m never-read rows (shuffled);
        with K > 1 every query repeats query 0 (identical selections)."""
        if cold:
            sel = self.cold_order[:bs, i * k : (i + 1) * k]
        else:
            hits = self.res[:bs].gather(1, self.hot_pick[:bs, : k - m])
            sel = torch.cat([hits, self.nonres[:bs, i * m : (i + 1) * m]], 1)
            sel = sel.gather(1, torch.rand(bs, k, device=sel.device).argsort(1))
        return sel[:, None, :].expand(bs, K, k).contiguous()


class Case:
    def __init__(
        self,
        st: State,
        host: torch.Tensor,
        pool: torch.Tensor,
        item: int,
        bs: int,
        K: int,
        k: int,
        m: int,
        cold: bool,
    ) -> None:
        from kernels import resolver as kres

        self.kres, self.st, self.host, self.pool, self.item = kres, st, host, pool, item
        self.bs, self.K, self.k, self.m, self.cold = bs, K, k, m, cold
        dev = pool.device
        self.ws = kres.Workspace.new(bs, K * k, st.B, dev)
        self.table = st.table(bs)
        base = host.data_ptr()
        self.host_ptrs = torch.tensor(
            [[base + r * st.S * item for r in range(bs)]], dtype=torch.int64, device=dev
        )
        self.payloads = torch.tensor([pool.data_ptr()], dtype=torch.int64, device=dev)
        self.visible = torch.full((bs, K), st.S, dtype=torch.int64, device=dev)
        self.locs = torch.empty(bs, K, k, dtype=torch.int64, device=dev)
        n = bs * K * k
        self.out = kres.CopyList(*(torch.empty(n, dtype=torch.int64, device=dev) for _ in range(4)))
        self.sels: dict[int, torch.Tensor] = {}

    def sel(self, i: int) -> torch.Tensor:
        if i not in self.sels:
            self.sels[i] = self.st.selection(self.bs, self.K, self.k, self.m, i, self.cold)
        return self.sels[i]

    def before(self, i: int) -> None:
        self.sel(i)
        self.st.restore(self.cold)

    def call(self, i: int) -> None:
        self.lookup(i)
        self.commit(i)

    def lookup(self, i: int) -> None:
        kres, st = self.kres, self.st
        kres.lookup(
            self.ws,
            self.table,
            self.sels[i],
            self.visible,
            self.locs,
            hot_slots=st.B,
            tail_rows=TAIL_ROWS,
            page_rows=PAGE_ROWS,
            rows_bound=st.tail_lo,
            finished_epoch=0,
        )

    def commit(self, i: int) -> None:
        kres, st = self.kres, self.st
        kres.commit(
            self.ws,
            self.table,
            self.sels[i],
            self.locs,
            st.stage_locs,
            self.out,
            epoch=1,
            hot_slots=st.B,
            host_ptrs=self.host_ptrs,
            payloads=self.payloads,
            row_bytes=self.item,
        )

    def check(self, i: int) -> dict:
        """One call from the restored state: every location holds its host row, every selected
        row is resident afterwards, each distinct missed row was copied exactly once."""
        self.before(i)
        n = min(self.bs, 16)
        if not self.cold:  # device rows of the resident slots hold their host rows (hits)
            rows = (self.st.res[:n].cpu() + torch.arange(n)[:, None] * self.st.S).flatten()
            dst = self.st.hot_locs[:n].flatten()
            self.pool[dst] = self.host.view(-1, self.item)[rows].to(self.pool.device)
        self.locs.fill_(-7)
        self.call(i)
        torch.cuda.synchronize()
        sel, locs = self.sels[i], self.locs
        totals = self.ws.totals[:9].tolist()
        rows = (sel[:n].cpu() + torch.arange(n)[:, None, None] * self.st.S).flatten()
        want = self.host.view(-1, self.item)[rows]
        got = self.pool[locs[:n].flatten()].cpu()
        hot = self.st.hot_rows[: self.bs].sort(1).values
        pos = torch.searchsorted(hot, sel[:, 0, :].contiguous()).clamp(max=self.st.B - 1)
        unique = (
            sum(int(torch.unique(sel[b]).numel()) for b in range(self.bs))
            if not self.cold
            else self.bs * self.k
        )
        res = {
            "status": totals[0],
            "copies": totals[1],
            "want_copies": self.m * self.bs if not self.cold else unique,
            "data_equal": bool(torch.equal(got, want)),
            "rows_compared": int(rows.numel()),
            "selected_resident": bool((hot.gather(1, pos) == sel[:, 0, :]).all()),
        }
        res["ok"] = (
            res["status"] == 0
            and res["data_equal"]
            and res["selected_resident"]
            and res["copies"] == res["want_copies"]
        )
        return res


def kres_select() -> str:
    from kernels.resolver import default_select

    return default_select()


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


def run_ours(args: dict, rec: dict) -> None:
    dev = torch.device("cuda")
    items = [int(x) for x in args["items"].split(",")]
    configs = [tuple(int(v) for v in c.split(":")) for c in args["configs"].split(",")]
    batches = [int(x) for x in args["batches"].split(",")]
    profiles = args["profiles"].split(",")
    P, S = max(batches), args["seq_len"]
    calls = 1 + args["warmup"] + args["reps"] + args["wall_reps"]
    t0 = time.time()
    host_raw, how = alloc_host(P * S * max(items))
    fill_random(host_raw, dev)
    rec["setup"].update(
        host_alloc=how, host_pool_bytes=host_raw.numel(), host_prepare_s=round(time.time() - t0, 1)
    )
    rec["ceiling"] = {"h2d_pinned_1GiB_GBps": h2d_memcpy_gbps(dev)}
    h2d = rec["ceiling"]["h2d_pinned_1GiB_GBps"]
    print(
        f"host pool {host_raw.numel() / 1e9:.1f} GB ({how}) in {time.time() - t0:.0f}s; "
        f"memcpy {h2d:.1f} GB/s",
        flush=True,
    )
    flush = Flusher(dev)
    states = {B: State(P, S, B, dev) for B in sorted({b for _, b in configs})}
    for item in items:
        host = host_raw[: P * S * item]
        pool = torch.empty(
            max(st.pool_rows for st in states.values()), item, dtype=torch.uint8, device=dev
        )
        for k, B in configs:
            st = states[B]
            for bs in batches:
                for prof in profiles:
                    cold = prof == "cold"
                    m = k if cold else round(PROFILES[prof] * k)
                    if (k * calls > st.tail_lo) if cold else (m * calls > st.nonres.shape[1]):
                        continue  # not enough never-read rows for every call
                    case = Case(st, host, pool, item, bs, 1, k, m, cold)
                    r = {
                        "item_bytes": item,
                        "top_k": k,
                        "hot_buffer": B,
                        "batch": bs,
                        "profile": prof,
                        "K": 1,
                        "unique_miss_rows": m * bs,
                        "miss_bytes": m * bs * item,
                    }
                    r["check"] = case.check(0)
                    ts = time_gpu(
                        case.call, args["reps"], args["warmup"], before=case.before, flush=flush
                    )
                    r["us"] = summarize(ts)
                    us = r["us_per_call"] = r["us"]["median"]
                    if m:
                        r["GBps"] = r["miss_bytes"] / us / 1e3
                        r["frac_of_h2d_memcpy"] = r["GBps"] / h2d
                    first = 1 + args["warmup"] + args["reps"]
                    r["wall_us_median"] = statistics.median(
                        time_wall(
                            case.call, range(first, first + args["wall_reps"]), case.before, flush
                        )
                    )
                    rec["cases"].append(r)
                    write_json(args["out"], rec)  # partial results survive a timeout
                    print_case(r)
                    del case
        rec["fit"] = rec.get("fit", {})
        pts = [
            (c["miss_bytes"], c["us_per_call"])
            for c in rec["cases"]
            if c["item_bytes"] == item and c["profile"] in ("miss20", "cold")
        ]
        rec["fit"][str(item)] = fit_gbps(pts)
        if item == items[0]:
            run_k8(args, rec, states[configs[0][1]], host, pool, item, configs[0][0], flush)
            if args["blocks_sweep"]:
                run_blocks_sweep(args, rec, states[configs[0][1]], host, pool, item, configs[0][0])
        del pool
    torch.cuda.cudart().cudaHostUnregister(host_raw.data_ptr()) if how.startswith(
        "cudaHost"
    ) else None
    del host_raw


def run_k8(args: dict, rec: dict, st: State, host, pool, item: int, k: int, flush) -> None:
    """K = 8 identical selections vs K = 1 (cold, batch 32): one copy per distinct row."""
    bs = min(32, st.P)
    out = {}
    for K in (1, 8):
        case = Case(st, host, pool, item, bs, K, k, k, True)
        chk = case.check(0)
        ts = time_gpu(case.call, args["reps"], args["warmup"], before=case.before, flush=flush)
        out[f"K{K}"] = {"us": summarize(ts), "copies": chk["copies"], "check": chk}
    rec["k8_identical"] = {
        "item_bytes": item,
        "top_k": k,
        "batch": bs,
        **out,
        "ratio_K8_over_K1": out["K8"]["us"]["median"] / out["K1"]["us"]["median"],
    }
    print(
        f"K=8 identical: {out['K8']['us']['median']:.1f} us ({out['K8']['copies']} copies) vs "
        f"K=1 {out['K1']['us']['median']:.1f} us ({out['K1']['copies']} copies)",
        flush=True,
    )


def run_blocks_sweep(args: dict, rec: dict, st: State, host, pool, item: int, k: int) -> None:
    """Lookup with 1 and 2 blocks per SM (DHISPARSE_LOOKUP_BLOCKS) at batch 32 and 160, plus
    launch 1 alone. Calls take windows after the main cases' (never read by them; batch 160
    re-reads batch 32's rows of its first 32 requests)."""
    flush = Flusher(pool.device)
    calls = 1 + args["warmup"] + args["reps"] + args["wall_reps"]
    out = []
    for bs in (b for b in (32, 160) if b <= st.P):
        for prof in ("hit100", "miss2", "miss20"):
            m, off = round(PROFILES[prof] * k), calls
            for blocks in ("1", "2"):
                n = args["warmup"] + args["reps"]
                if m * (off + 2 * n) > st.nonres.shape[1]:
                    continue
                os.environ["DHISPARSE_LOOKUP_BLOCKS"] = blocks
                case = Case(st, host, pool, item, bs, 1, k, m, False)
                ok = case.check(off)["ok"]
                full = time_gpu(
                    lambda i, o=off, c=case: c.call(i + o),
                    args["reps"],
                    args["warmup"],
                    before=lambda i, o=off, c=case: c.before(i + o),
                    flush=flush,
                )
                off += n + 1
                look = time_gpu(
                    lambda i, o=off, c=case: c.lookup(i + o),
                    args["reps"],
                    args["warmup"],
                    before=lambda i, o=off, c=case: c.before(i + o),
                    flush=flush,
                )
                off += n + 1
                r = {
                    "batch": bs,
                    "profile": prof,
                    "lookup_blocks_per_sm": int(blocks),
                    "ok": ok,
                    "us": statistics.median(full),
                    "lookup_us": statistics.median(look),
                }
                out.append(r)
                print(
                    f"blocks/SM={blocks} bs={bs:3d} {prof:6s} us={r['us']:7.1f} "
                    f"lookup_us={r['lookup_us']:7.1f} ok={ok}",
                    flush=True,
                )
    os.environ.pop("DHISPARSE_LOOKUP_BLOCKS", None)
    rec["lookup_blocks_sweep"] = {"item_bytes": item, "top_k": k, "cases": out}
    del flush


def run_vs_reference(rec: dict, reps: int = 5) -> None:
    """Drop-in ``kernels.resolver.resolve`` + ``apply_copies`` against the torch reference on
    the same GPU and group shape (8 requests of 20K rows, 656 B, B 4096, top_k 2048, all
    misses); host wall time per call, both synchronized (the reference syncs anyway)."""
    from kernels import resolver as kres
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


def print_case(r: dict) -> None:
    gb = f"{r['GBps']:6.1f}" if r.get("GBps") else "   -  "
    print(
        f"{r['item_bytes']:5d} k={r['top_k']:4d} bs={r['batch']:3d} {r['profile']:6s} "
        f"us={r['us_per_call']:8.1f} "
        f"GB/s={gb} wall={r['wall_us_median']:8.1f} ok={r['check']['ok']}",
        flush=True,
    )


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
    rewrite OURS with PEER's cases merged and the side-by-side table regenerated."""
    rec = json.loads(Path(ours).read_text())
    merge_peer(rec, json.loads(Path(peer).read_text()))
    if git_sha and rec.get("env", {}).get("git_sha") in (None, "unknown"):
        rec["env"]["git_sha"] = git_sha
        rec["env"]["git_sha_note"] = "filled in after the run (no .git on the device)"
    write_json(ours, rec)


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
) -> None:
    """Fused resolver vs the memcpy ceiling and SGLang HiSparse's kernel (JSON + table)."""
    args = dict(locals())
    rec = {
        "what": "dhisparse fused resolver (kernels/resolver.cu), sync-free path: "
        "lookup + commit/copy",
        "env": environment()
        | {
            "victim_select": kres_select(),
            "lookup_blocks": os.environ.get("DHISPARSE_LOOKUP_BLOCKS", "auto"),
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
    _print_table(rec)


def _print_table(rec: dict) -> None:
    try:
        from rich.console import Console
        from rich.markdown import Markdown

        Console(width=160).print(Markdown(rec["table_md"]))
    except ImportError:
        print(rec["table_md"])
    print(json.dumps({k: rec.get(k) for k in ("ceiling", "fit", "peer_ceiling")}, default=str))
    if "k8_identical" in rec:
        k8 = rec["k8_identical"]
        print(
            f"K8/K1 = {k8['ratio_K8_over_K1']:.2f}; "
            f"copies K1={k8['K1']['copies']} K8={k8['K8']['copies']}"
        )


if __name__ == "__main__":
    import typer

    typer.run(command)
