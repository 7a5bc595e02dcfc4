"""The timed runs of the resolver benchmark: every (row size, top_k, batch, profile) case,
K = 8 identical selections, and the lookup blocks-per-SM sweep."""

from __future__ import annotations

import os
import statistics
import time

import torch

from bench.common import Flusher, h2d_memcpy_gbps, summarize, time_gpu, time_wall, write_json
from bench.resolver.case import Case
from bench.resolver.pool import State, Windows, alloc_host, fill_random, missed_rows
from bench.resolver.report import fit_gbps, print_case


def kres_select() -> str:
    from kernels.resolver import default_select

    return default_select()


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
                    m = missed_rows(prof, k)
                    if calls > st.windows(k, m, cold):
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
        if args["copy_sweep"]:
            run_copy_sweep(args, rec, host, pool, item, configs[0])
        del pool
    settle_ceiling(rec, h2d_memcpy_gbps(dev))
    torch.cuda.cudart().cudaHostUnregister(host_raw.data_ptr()) if how.startswith(
        "cudaHost"
    ) else None
    del host_raw


def settle_ceiling(rec: dict, again: float) -> None:
    """The memcpy measured again after the cases: the ceiling is the faster of the two (a
    run at 44cfc1c measured 51.6 GB/s before its cases, where the peer's process in the same
    device call measured 55.4), and every case's fraction of it is recomputed."""
    first = rec["ceiling"]["h2d_pinned_1GiB_GBps"]
    h2d = max(first, again)
    rec["ceiling"].update(h2d_pinned_1GiB_GBps=h2d, h2d_pinned_1GiB_GBps_runs=[first, again])
    for r in rec["cases"]:
        if "GBps" in r:
            r["frac_of_h2d_memcpy"] = r["GBps"] / h2d
    print(f"memcpy again {again:.1f} GB/s; ceiling {h2d:.1f} GB/s", flush=True)


def run_k8(args: dict, rec: dict, st: State, host, pool, item: int, k: int, flush) -> None:
    """K = 8 identical selections vs K = 1 (cold, batch 32): one copy per distinct row."""
    bs = min(32, st.P)
    calls, windows = 1 + args["warmup"] + args["reps"], st.windows(k, k, True)
    if calls > windows:  # as the cases: only never-read rows
        rec["k8_identical"] = {
            "skipped": f"seq_len={st.S}: {windows} cold windows of {k} rows, "
            f"{calls} calls need one each"
        }
        print(f"K=8 identical: skipped ({rec['k8_identical']['skipped']})", flush=True)
        return
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


LOOKUP_SETTINGS = (("1", "index"), ("1", "rank"), ("2", "index"), ("2x512", "index"),
                   ("2x512", "rank"))  # (DHISPARSE_LOOKUP_BLOCKS, DHISPARSE_LOOKUP_HITS)


def run_blocks_sweep(args: dict, rec: dict, st: State, host, pool, item: int, k: int) -> None:
    """Lookup shapes (DHISPARSE_LOOKUP_BLOCKS: one or two 1024-thread blocks per SM, two
    512-thread ones) and hit forms (DHISPARSE_LOOKUP_HITS: index, rank) at batch 1, 32 and
    160, plus launch 1 alone. Calls take windows after the main cases' and each setting
    the next ones of its case, starting over after the main cases' once a case runs out
    (L2 is flushed before every timing; batch 160 re-reads batch 32's rows of its first 32
    requests)."""
    flush = Flusher(pool.device)
    calls = 1 + args["warmup"] + args["reps"] + args["wall_reps"]
    n = args["warmup"] + args["reps"]
    out, windows = [], Windows()
    for bs in (b for b in (1, 32, 160) if b <= st.P):
        for prof in ("hit100", "miss2", "miss20"):
            m = missed_rows(prof, k)
            have = st.windows(k, m, False) - calls
            for blocks, hits in LOOKUP_SETTINGS:
                off = calls + windows.take((bs, prof), 2 * (n + 1), have)
                os.environ["DHISPARSE_LOOKUP_BLOCKS"] = blocks
                os.environ["DHISPARSE_LOOKUP_HITS"] = hits
                case = Case(st, host, pool, item, bs, 1, k, m, False)
                ok = case.check(off)["ok"]
                us = {}  # both launches, then the lookup alone, each on rows unread so far
                for key, fn in (("us", case.call), ("lookup_us", case.lookup)):
                    us[key] = statistics.median(time_gpu(
                        lambda i, o=off, f=fn: f(i + o),
                        args["reps"],
                        args["warmup"],
                        before=lambda i, o=off, c=case: c.before(i + o),
                        flush=flush,
                    ))
                    off += n + 1
                r = {
                    "batch": bs,
                    "profile": prof,
                    "lookup_blocks": blocks,
                    "hits": hits,
                    "ok": ok,
                    **us,
                }
                out.append(r)
                print(
                    f"lookup={blocks:5s} hits={hits:5s} bs={bs:3d} {prof:6s} us={r['us']:7.1f} "
                    f"lookup_us={r['lookup_us']:7.1f} ok={ok}",
                    flush=True,
                )
    os.environ.pop("DHISPARSE_LOOKUP_BLOCKS", None)
    os.environ.pop("DHISPARSE_LOOKUP_HITS", None)
    rec["lookup_blocks_sweep"] = {"item_bytes": item, "top_k": k, "cases": out}
    del flush


COPY_SWEEP = ((32, "hit100"), (1, "cold"), (32, "cold"), (1, "miss20"), (32, "miss20"),
              (160, "miss20"))


def run_copy_sweep(args: dict, rec: dict, host, pool, item: int, config) -> None:
    """Copy blocks of the commit (the kernel's rule, a fixed count; fewer blocks = fewer host
    rows in flight at once), the copy blocks' preload (DHISPARSE_COPY_EARLY) and the
    commit's programmatic dependent launch (DHISPARSE_PDL), on the no-miss and miss-heavy
    cases, for each row size (``copy_sweeps`` in the JSON, by row size; the first row
    size's also as ``copy_sweep``, its name before). A fresh State (new random row
    order, same host pool): its calls may re-read rows the main cases read (L2 is flushed
    before each timing); a case out of never-read windows starts over at window 0."""
    from kernels._loader import sm_count

    k, B = config
    st = State(max(b for b, _ in COPY_SWEEP), args["seq_len"], B, pool.device)
    flush = Flusher(pool.device)
    reps, warm = max(5, args["reps"] // 2), 2
    every = sm_count(pool.device.index or 0) * 2
    # (copy blocks (0 = the kernel's rule), victim select, PDL, preload, copies by the TMA
    # (None = DHISPARSE_COPY_TMA)): the defaults first (a fixed count never preloads: the
    # preload is the copy rule's sparse case)
    settings = [(0, "radix", "1", True, None), (0, "radix", "1", False, None),
                (0, "radix", "0", True, None), (every, "radix", "1", False, None),
                (16, "radix", "1", False, None), (0, "radix", "1", True, False),
                (0, "radix", "1", True, True)]
    pdl_before = os.environ.get("DHISPARSE_PDL")
    out, windows = [], Windows()
    for bs, prof in COPY_SWEEP:
        if bs > st.P:
            continue
        cold = prof == "cold"
        m = missed_rows(prof, k)
        case = Case(st, host, pool, item, bs, 1, k, m, cold)
        have = st.windows(k, m, cold)
        for blocks, select, pdl, early, tma in settings:
            off = windows.take((bs, prof), reps + warm + 1, have)
            case.copy_blocks, case.select, case.early, case.tma = blocks, select, early, tma
            os.environ["DHISPARSE_PDL"] = pdl
            ok = case.check(off)["ok"]
            us = statistics.median(time_gpu(
                lambda i, o=off, c=case: c.call(i + o + 1), reps, warm,
                before=lambda i, o=off, c=case: c.before(i + o + 1), flush=flush))
            r = {"batch": bs, "profile": prof, "select": select, "pdl": pdl == "1",
                 "early": early, "tma": tma, "copy_blocks": blocks or "rule", "ok": ok, "us": us,
                 "GBps": m * bs * item / us / 1e3 if m else None}
            out.append(r)
            print(f"{item:5d} copy_blocks={r['copy_blocks']!s:4s} {select:5s} pdl={pdl} "
                  f"early={int(early)} tma={'env' if tma is None else int(tma)} "
                  f"bs={bs:3d} {prof:6s} us={us:8.1f} "
                  f"GB/s={(r['GBps'] or 0):5.1f} ok={ok}", flush=True)
        del case
    if pdl_before is None:
        os.environ.pop("DHISPARSE_PDL", None)
    else:
        os.environ["DHISPARSE_PDL"] = pdl_before
    sweep = {"item_bytes": item, "top_k": k, "cases": out}
    rec.setdefault("copy_sweeps", {})[str(item)] = sweep
    rec.setdefault("copy_sweep", sweep)
    write_json(args["out"], rec)  # a timeout later keeps it
    del st, flush
