"""Run the SGLang HiSparse peer harness with its host pool in a kvstore segment.

    python3 -m bench.resolver.peer_on_segment .peer/sglang-hisparse/bench_peer_hisparse.py ARGS

The harness is loaded from its path unchanged; only its ``alloc_host`` is replaced by
``bench.resolver.pool.alloc_host(nbytes, "shm")`` — the memory our benchmark reads with
``DHISPARSE_BENCH_HOST=shm`` — so both kernels can be compared on the same host memory.
The harness records the allocation in its JSON (``setup.host_alloc``).
"""

from __future__ import annotations

import importlib.util
import sys


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit("usage: peer_on_segment PATH_TO_bench_peer_hisparse.py [ARGS...]")
    spec = importlib.util.spec_from_file_location("bench_peer_hisparse", argv[0])
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load the peer harness from {argv[0]!r}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)

    from bench.resolver.pool import alloc_host

    mod.alloc_host = lambda nbytes, dev: alloc_host(nbytes, "shm")
    return int(mod.main(argv[1:]) or 0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
