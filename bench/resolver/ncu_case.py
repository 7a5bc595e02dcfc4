"""One benchmark case run a few times, for Nsight Compute (``ncu``) to profile its launches.

    ncu --clock-control none -k regex:resolve_ --launch-skip 8 --launch-count 2 \
        --set full --import-source yes python3 -m bench.resolver.ncu_case --batch 32

Same setup as ``bench.bench_resolver`` (656 B rows, top_k 2048, B 4096, 100K-row requests);
build with ``DHISPARSE_RESOLVER_LINEINFO=1`` to map stalls to source lines. CUDA only.
"""

from __future__ import annotations

import argparse

import torch

from bench.common import Flusher


def main() -> None:
    from bench.resolver.case import Case
    from bench.resolver.pool import State, alloc_host, fill_random, missed_rows

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--profile", default="hit100")
    ap.add_argument("--item", type=int, default=656)
    ap.add_argument("--calls", type=int, default=12)
    a = ap.parse_args()
    dev = torch.device("cuda")
    S, k, B = 100_000, 2048, 4096
    host, _ = alloc_host(a.batch * S * a.item)
    fill_random(host, dev)
    st = State(a.batch, S, B, dev)
    pool = torch.empty(st.pool_rows, a.item, dtype=torch.uint8, device=dev)
    case = Case(st, host, pool, a.item, a.batch, 1, k, missed_rows(a.profile, k),
                a.profile == "cold")
    print("check", case.check(0), flush=True)
    flush = Flusher(dev)
    for i in range(1, a.calls + 1):
        case.before(i)
        flush()
        case.call(i)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
