"""CUDA kernels (CuPy RawModule) with a torch reference beside each.

Importing this package needs only torch: CuPy is imported inside the functions that
compile or launch a kernel, so CPU machines (and CI) use ``kernels.reference`` and the
hierarchy's torch resolver.

    kernels.copy       gather / page / follower / draft-ring / commit copies
    kernels.resolver   fused resolver: the sync-free lookup / commit / plan-copy launches
    kernels.dropin     drop-in twins of services.decode.hierarchy.resolve / apply_copies
    kernels.reference  the torch reference of every copy kernel
"""

from __future__ import annotations
