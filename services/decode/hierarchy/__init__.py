"""The decode worker's KV hierarchy: GPU tiers, host backing and the exact resolver.

This is the torch reference (CPU or CUDA tensors; ``HierarchyConfig.device``). The CUDA
kernels replace hot spots and are compared bit-exactly against it.

Memory layout of one *source group* (the unit of resolution). Every payload layer of the
group has one pool tensor ``uint8 [pool_rows, row_bytes]`` with the SAME layout, so one
location vector indexes all of them (``payload[locations]`` is one gather)::

    pool_rows = num_pages * p + staging_rows                       (p = page_rows)

    row 0                                                    num_pages*p        pool_rows
    | page 0 | page 1 | page 2 | ...                  | page M-1 | staging arena     |
       ^        ^        ^                                         (overflow rows of a
       |        |        +-- optional history page of request r    resolve; released
       |        +----------- tail ring of request r (T rows)       after its readers,
       +-------------------- hot cache of request r (B slots)      promoted to hot)

    pages come from one free list (PagePool): required = hot cache + tail (+ history in
    the resident policy), optional = imported history (reclaimable); reserve never lent.

Per request (RequestState, see request.py for the tensors)::

    rows:   0 ..... eligible*p ..... tail_lo ...... committed ...... tail_hi
            | optional pages     |  host + hot   | tail: committed | unverified |
            (ready map, or host)   (LRU, B slots)   (ring of T rows, row s at s % T)

Host backing: one ``HostBacking`` (services.common.backing) per (request, payload layer):
``InProcessBacking`` here, the kvstore's shared-memory one in production.

Topologies (SourceSpec.payload_layers):
    GLM-like       one selection, followers with own bytes: payload_layers = #followers;
                   resolve once, ``apply_copies(group, plan, layer)`` per follower layer.
    DeepSeek-like  one shared payload read by several layers: payload_layers = 1;
                   each consumer either reuses ``plan.locations`` or resolves again
                   (rows fetched earlier are hot hits).

Typical step (engine)::

    locs = open_rows(g, rid, K)                      # tail rows of this round
    g.payload(l)[locs] = kv_l                        # per payload layer
    plan = resolve(g, rids, selections[b,K,k], visible[b,K])
    apply_copies(g, plan, l)                         # per payload layer, before reading
    ... attention reads g.payload(l)[plan.locations] ...
    g.readers_finished(plan.epoch); release_staging(g)
    commit_rows(g, rid, n + 1 + accepted); backup(g, rid)
"""

from __future__ import annotations

from .backing import InProcessBacking, InProcessBackingProvider
from .config import HierarchyConfig, SourceSpec, completed_rows
from .counters import SelectionCounts
from .group import SourceGroup
from .pages import (
    admit,
    backup,
    can_admit,
    commit_rows,
    coverage,
    open_rows,
    optional_pages,
    populate,
    publish_pages,
    release,
    retire,
)
from .promotion import release_staging
from .request import RequestState, lru_order
from .resolver import ResolvePlan, apply_copies, resolve
from .staging import StagedRow, StagingArena
from .worker import Hierarchy

__all__ = [
    "Hierarchy",
    "HierarchyConfig",
    "InProcessBacking",
    "InProcessBackingProvider",
    "RequestState",
    "ResolvePlan",
    "SelectionCounts",
    "SourceGroup",
    "SourceSpec",
    "StagedRow",
    "StagingArena",
    "admit",
    "apply_copies",
    "backup",
    "can_admit",
    "commit_rows",
    "completed_rows",
    "coverage",
    "lru_order",
    "open_rows",
    "optional_pages",
    "populate",
    "publish_pages",
    "release",
    "release_staging",
    "resolve",
    "retire",
]
