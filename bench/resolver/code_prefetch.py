"""Diagnostic (issue 7, run 127): the call's kernel code asked of L2 at the lookup's start.

After the benchmark's L2 flush the first fetch of every instruction line comes from DRAM;
a lookup run just before on a State of its own (``tma_cost`` variant ``auto_warmlookup``)
took 0.5-1 µs off the next call (run 126). The resolver built with
``-DRESOLVER_CODE_PREFETCH`` has ``code_addresses`` (every kernel's code address, in
``CODE_KERNELS``' order) and ``g_code`` (the two ranges the lookup's threads prefetch):
``arm`` finds the two kernels a case launches and writes their ranges. A kernel's range
ends at the next kernel's address; the last one's is taken as long as the one before it.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

CODE_KERNELS = (
    "resolve_lookup", "resolve_lookup_2", "resolve_lookup_rank", "resolve_lookup_2_rank",
    "resolve_lookup_q", "resolve_lookup_2_q", "resolve_lookup_rank_q", "resolve_lookup_2_rank_q",
    "resolve_commit_16", "resolve_commit_8", "resolve_commit_4", "resolve_commit_16_tma",
    "plan_copy_16", "plan_copy_8", "plan_copy_4",
    "promote_staged_16", "promote_staged_8", "promote_staged_4", "code_end", "code_addresses",
)


def code_ranges(flags: tuple[str, ...], dev: int) -> dict[str, tuple[int, int]]:
    """Each kernel's [start, end) code addresses in the resolver module built with ``flags``."""
    from kernels._loader import kernel, launch, ptr

    out = torch.zeros(len(CODE_KERNELS), dtype=torch.int64, device=torch.device("cuda", dev))
    launch(kernel("resolver", "code_addresses", dev, False, flags), (1,), (32,), (ptr(out),))
    addrs = sorted(zip((a & (2**64 - 1) for a in out.tolist()), CODE_KERNELS, strict=True))
    ranges = {n: (a, b) for (a, n), (b, _) in itertools.pairwise(addrs)}
    (a0, _), (a1, n1) = addrs[-2], addrs[-1]
    ranges[n1] = (a1, a1 + (a1 - a0))
    return ranges


def which(fn, flags: tuple[str, ...], dev: int) -> tuple[str, bool]:
    """The name (and big_shared) under which ``kernel`` returned ``fn`` for ``flags``."""
    from kernels._loader import kernel

    for name in CODE_KERNELS[:12]:
        for big in (True, False):
            if kernel("resolver", name, dev, big, flags) is fn:
                return name, big
    raise LookupError("not a resolver kernel of these flags")


def arm(lookup_fn, lookup_flags: tuple[str, ...], commit_fn, commit_flags: tuple[str, ...],
        dev: int) -> dict:
    """Writes the two kernels' ranges into the lookup module's ``g_code``; returns them."""
    from kernels._loader import module

    lname, _ = which(lookup_fn, lookup_flags, dev)
    cname, _ = which(commit_fn, commit_flags, dev)
    lo = code_ranges(lookup_flags, dev)[lname]
    co = code_ranges(commit_flags, dev)[cname]
    buf = np.array([lo[0], lo[1], co[0], co[1]], dtype=np.uint64)
    module("resolver", dev, lookup_flags).get_global("g_code").copy_from_host(
        buf.ctypes.data, buf.nbytes)
    torch.cuda.synchronize()
    return {"lookup": lname, "lookup_bytes": lo[1] - lo[0], "commit": cname,
            "commit_bytes": co[1] - co[0], "lookup_at": hex(lo[0]), "commit_at": hex(co[0])}
