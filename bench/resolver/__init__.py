"""The resolver benchmark, by concept (entry point: ``bench/bench_resolver.py``).

- ``pool``: the page-locked host pool and the requests' hot caches (``State``)
- ``case``: one timed case of the sync-free path and its correctness check (``Case``)
- ``runs``: the main cases, K = 8 identical selections, the lookup blocks sweep
- ``reference``: the drop-in resolver against the torch reference
- ``report``: the GB/s fit, per-case lines, the side-by-side table
- ``peer``: SGLang HiSparse's harness and its cases merged beside ours
"""
