"""Copy blocks of the resolver's commit, swept: for each row size and (batch, profile), the
whole sync-free call (lookup + commit with the miss copies of one payload layer) with the
copies spread over a fixed number of blocks, and with the kernel's rule. Fewer blocks keep
fewer host rows in flight; which count reads fastest depends on how the misses spread over
the requests (bench/README.md "Host memory"). A fresh ``State`` per row size; a case out of
never-read row windows starts over at window 0 (L2 is flushed before each timing). JSON out,
a table printed.

Run: ``python3 -m bench.resolver.copy_blocks --out copy_blocks.json`` (on the GPU machine).
"""

from __future__ import annotations

import statistics

import torch

from bench.common import Flusher, environment, h2d_memcpy_gbps, time_gpu, write_json
from bench.resolver.case import Case
from bench.resolver.pool import State, Windows, alloc_host, fill_random, missed_rows


def parse_cases(cases: str) -> list[tuple[int, str]]:
    """``"32:miss20,1:cold"`` -> [(32, "miss20"), (1, "cold")]."""
    out = []
    for part in cases.split(","):
        bs, prof = part.split(":")
        out.append((int(bs), prof))
    return out


def command(
    out: str = "bench/results/copy_blocks_h200.json",
    items: str = "656,1152",
    cases: str = "1:cold,8:cold,32:cold,160:cold,8:miss20,32:miss20,160:miss20",
    blocks: str = "0,16,24,32,48,66,132,264",
    top_k: int = 2048,
    hot: int = 4096,
    seq_len: int = 100_000,
    reps: int = 10,
    warmup: int = 2,
) -> None:
    """µs per call and GB/s of distinct miss bytes for each copy-block count (0 = the rule)."""
    dev = torch.device("cuda")
    todo, counts = parse_cases(cases), [int(b) for b in blocks.split(",")]
    sizes = [int(x) for x in items.split(",")]
    P = max(bs for bs, _ in todo)
    host_raw, how = alloc_host(P * seq_len * max(sizes))
    fill_random(host_raw, dev)
    rec = {"what": "resolver call time by commit copy blocks", "env": environment(),
           "setup": dict(items=sizes, cases=cases, blocks=counts, top_k=top_k, hot=hot,
                         seq_len=seq_len, reps=reps, host_alloc=how),
           "ceiling": {"h2d_pinned_1GiB_GBps": h2d_memcpy_gbps(dev)}, "cases": []}
    h2d = rec["ceiling"]["h2d_pinned_1GiB_GBps"]
    flush = Flusher(dev)
    for item in sizes:
        host = host_raw[: P * seq_len * item]
        st = State(P, seq_len, hot, dev)
        pool = torch.empty(st.pool_rows, item, dtype=torch.uint8, device=dev)
        windows = Windows()
        for bs, prof in todo:
            cold, m = prof == "cold", missed_rows(prof, top_k)
            case = Case(st, host, pool, item, bs, 1, top_k, m, cold)
            have = st.windows(top_k, m, cold)
            for n in counts:
                off = windows.take((bs, prof), reps + warmup + 1, have)
                case.copy_blocks = n
                ok = case.check(off)["ok"]
                us = statistics.median(time_gpu(
                    lambda i, o=off, c=case: c.call(i + o + 1), reps, warmup,
                    before=lambda i, o=off, c=case: c.before(i + o + 1), flush=flush))
                gbps = m * bs * item / us / 1e3 if m else None
                r = {"item_bytes": item, "batch": bs, "profile": prof, "copy_blocks": n or "rule",
                     "ok": ok, "us": us, "GBps": gbps,
                     "frac_of_h2d_memcpy": gbps / h2d if gbps else None}
                rec["cases"].append(r)
                print(f"{item:5d} bs={bs:3d} {prof:6s} blocks={r['copy_blocks']!s:4s} "
                      f"us={us:8.1f} GB/s={(gbps or 0):5.1f} ({100 * (gbps or 0) / h2d:3.0f}%) "
                      f"ok={ok}", flush=True)
                write_json(out, rec)
            del case
        del pool, st
    write_json(out, rec)


if __name__ == "__main__":
    import typer

    typer.run(command)
