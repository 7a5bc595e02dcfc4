"""Invariant checkers (DESIGN.md §2). Each raises AssertionError with a precise message.

Tests call them after every step; they read state only (never change it).
``truth`` maps ``(request_id, layer)`` to the original rows ``uint8 [max_rows, row_bytes]``
(CPU) of that request and payload layer: the resident reference copy.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .group import SourceGroup
from .request import (
    RANK_BUILT,
    RANK_VERSION,
    RANK_WORDS,
    hot_entries,
    rank_cache_contents,
    rank_layout,
    rank_words,
)
from .resolver import ResolvePlan

Truth = Mapping[tuple[str, int], torch.Tensor]


def _ready_rows(group: SourceGroup, rows: torch.Tensor, state) -> torch.Tensor:
    return state.page_ready.cpu()[rows // group.config.page_rows]


def assert_recoverable(group: SourceGroup) -> None:
    """I1: every committed row is in the tail, in a ready page, or backed on host."""
    for rid, state in group.requests.items():
        rows = torch.arange(state.committed)
        ok = (rows >= state.tail_lo) | _ready_rows(group, rows, state) | group.backed_mask(state)[
            : state.committed
        ]
        assert bool(ok.all()), (
            f"I1: request {rid!r} rows {rows[~ok].tolist()} are neither on device nor backed"
        )
        assert state.tail_span <= group.config.tail_rows, f"I1: tail of {rid!r} overflows"


def assert_capacity(group: SourceGroup) -> None:
    """I2: required + optional + reserve <= M, and the request count fits its slots."""
    c, cfg = group.pages.counts(), group.config
    assert c["required"] + c["optional"] + c["free"] == cfg.num_pages, f"I2: pages {c}"
    assert c["required"] + c["optional"] + c["reserve"] <= cfg.num_pages, f"I2: over M: {c}"
    assert len(group.requests) <= cfg.max_requests, "I2: more requests than slots"
    for rid, state in group.requests.items():
        assert len(state.required_pages) == cfg.required_pages, f"I2: {rid!r} required pages"
        for page in state.required_pages:
            assert group.pages.kind.get(page) == "required", f"I2: {rid!r} page {page} kind"
        for g in state.optional_logical_pages():
            page = int(state.page_map[g])
            assert group.pages.kind.get(page) == "optional", f"I2: {rid!r} page {page} kind"


def assert_exact(
    group: SourceGroup,
    truth: Truth,
    plan: ResolvePlan | None = None,
    selections: torch.Tensor | None = None,
    layers: list[int] | None = None,
) -> None:
    """I3: ``pool[loc] == original row`` for every plan entry, and for every device copy.

    With ``plan``/``selections``: every non-padding entry of the plan, on ``layers``
    (default all; pass the layers the plan was applied to). Always: every committed tail
    row, ready page row, hot slot and staged row, and every backed host row, bit for bit.
    """
    layers = list(range(group.spec.payload_layers)) if layers is None else layers
    # each payload read once (one copy to the host for a device group) and the staged rows
    # grouped by request once, not per request and layer: a batch of 256 requests with 8192
    # staging rows made that 512 payload copies and 4 M staged-row objects per check
    pools = [p.cpu() for p in group.payloads]
    if plan is not None and selections is not None:
        sel, loc = selections.cpu(), plan.locations.cpu()
        assert torch.equal(sel < 0, loc < 0), "I3: padding and locations disagree"
        for b, rid in enumerate(plan.request_ids):
            valid = sel[b] >= 0
            for layer in layers:
                got = pools[layer][loc[b][valid]]
                want = truth[(rid, layer)][sel[b][valid]]
                assert torch.equal(got, want), f"I3: plan rows of {rid!r} layer {layer} differ"
    staged: dict[str, list] = {}
    for e in group.staging.staged.values():
        staged.setdefault(e.request_id, []).append(e)
    for rid, state in group.requests.items():
        for layer in range(group.spec.payload_layers):
            _assert_state_exact(group, pools[layer], truth[(rid, layer)], state, layer,
                                staged.get(rid, []))


def _assert_state_exact(group: SourceGroup, pool: torch.Tensor, want: torch.Tensor, state,
                        layer: int, staged: list) -> None:
    """I3 for one request and payload layer; ``pool``: the layer's payload on the host,
    ``staged``: the request's staged rows."""
    p, rid = group.config.page_rows, state.request_id
    tail = torch.arange(state.tail_lo, state.tail_hi)
    got = pool[state.tail_locs.cpu()[tail % state.tail_locs.numel()]]
    assert torch.equal(got, want[tail]), f"I3: tail of {rid!r} layer {layer} differs"
    ready = torch.nonzero(state.page_ready.cpu()).flatten()
    rows = (ready[:, None] * p + torch.arange(p)).flatten()
    phys = (state.page_map.cpu()[ready][:, None] * p + torch.arange(p)).flatten()
    assert torch.equal(pool[phys], want[rows]), f"I3: ready pages of {rid!r} differ"
    if layer in group.pending_layers:
        return  # hot slots of a plan not yet applied to this layer hold stale bytes
    held = state.hot_rows.cpu() >= 0
    got = pool[state.hot_locs.cpu()[held]]
    assert torch.equal(got, want[state.hot_rows.cpu()[held]]), f"I3: hot of {rid!r} differs"
    for e in staged:
        assert torch.equal(pool[e.loc], want[e.row]), f"I3: staged row {e.row} of {rid!r}"
    if state.backings:
        backed = state.backings[layer].backed_mask()
        host = state.backings[layer].rows()
        assert torch.equal(host[backed], want[backed]), f"I3: host rows of {rid!r} differ"


def assert_ordering(group: SourceGroup) -> None:
    """I4 (+ I5): published locations point at allocated memory; epochs are ordered;
    hot slots hold backed committed rows only; uncommitted rows are never backed."""
    assert 0 <= group.finished_epoch <= group.clock, "I4: finished epoch ahead of clock"
    assert group.staging.max_epoch <= group.clock, "I4: staged epoch ahead of clock"
    for rid, state in group.requests.items():
        assert state.last_read_epoch <= group.clock, f"I4: {rid!r} read epoch ahead"
        assert state.tail_lo % group.config.page_rows == 0, f"I4: {rid!r} tail_lo unaligned"
        assert state.tail_lo <= state.committed <= state.tail_hi <= state.max_rows
        ready, mapped = state.page_ready.cpu(), state.page_map.cpu() >= 0
        assert not bool((ready & ~mapped).any()), f"I4: {rid!r} ready page without memory"
        assert not bool(mapped[state.map_hi :].any()), (
            f"I4: {rid!r} maps a page at or past map_hi={state.map_hi} (the lookup skips them)"
        )
        for page in state.page_map[state.page_map >= 0].tolist():
            assert page in group.pages.kind, f"I4: {rid!r} maps free page {page}"
        held = state.hot_rows.cpu()[state.hot_rows.cpu() >= 0]
        assert held.unique().numel() == held.numel(), f"I4: {rid!r} row in two hot slots"
        # a slot is protected while its stamp is past finished_epoch (request.py): stamps
        # are epochs opened by resolves
        assert not bool((state.hot_stamp > group.clock).any()), f"I4: {rid!r} stamp ahead"
        assert_hot_index(state)
        assert_hot_rank(state)
        backed = group.backed_mask(state)
        assert bool(backed[held].all()), f"I4: {rid!r} hot slot holds an unbacked row"
        assert bool((held < state.committed).all()), f"I4: {rid!r} hot row uncommitted"
        for backing in state.backings:
            assert not bool(backing.backed_mask()[state.committed :].any()), (
                f"I5: {rid!r} has uncommitted rows backed"
            )


def assert_hot_index(state) -> None:
    """``hot_index`` is the inverse of ``hot_rows`` (request.py): the held rows map to their
    slots' packed entries, every other row to -1."""
    rows, index = state.hot_rows.cpu(), state.hot_index.cpu()
    want = torch.full_like(index, -1)
    slots = torch.nonzero(state.hot_rows >= 0).flatten()
    want[rows[slots.cpu()]] = hot_entries(state, slots).cpu()
    bad = torch.nonzero(index != want).flatten()
    assert bad.numel() == 0, (
        f"I4: hot_index of {state.request_id!r} disagrees with hot_rows at rows "
        f"{bad[:8].tolist()}: {index[bad[:8]].tolist()} != {want[bad[:8]].tolist()}"
    )


def assert_hot_rank(state) -> None:
    """The CUDA lookup's cache (request.py hot_rank), where valid (built at the current
    version), holds what ``rank_cache_contents`` gives for the words it covers."""
    cache = state.hot_rank.cpu()
    if not cache.numel():
        return
    rid, cap = state.request_id, rank_words(state.max_rows)
    ent_at, bits_at, pre_at, length = rank_layout(state.max_rows, state.hot_rows.numel())
    assert cache.numel() == length, f"I4: hot_rank of {rid!r} holds {cache.numel()} values"
    if int(cache[RANK_BUILT]) != int(cache[RANK_VERSION]):
        return
    words = int(cache[RANK_WORDS])
    assert 0 < words <= cap, f"I4: hot_rank of {rid!r} covers {words} of {cap} words"
    entries, bits, prefix = (t.cpu() for t in rank_cache_contents(state, words))
    got = cache[bits_at:].view(torch.int32)[:words].to(torch.int64) & 0xFFFFFFFF
    bad = torch.nonzero(got != bits).flatten()
    assert bad.numel() == 0, f"I4: hot_rank bitmap of {rid!r} wrong at words {bad[:8].tolist()}"
    got = cache[pre_at:].view(torch.int16)[:words].to(torch.int64) & 0xFFFF
    bad = torch.nonzero(got != prefix).flatten()
    assert bad.numel() == 0, f"I4: hot_rank prefix of {rid!r} wrong at words {bad[:8].tolist()}"
    assert torch.equal(cache[ent_at : ent_at + entries.numel()], entries), (
        f"I4: hot_rank entries of {rid!r} are not the held rows' in row order"
    )


def assert_no_leak(group: SourceGroup) -> None:
    """I6: every allocated page is owned exactly once; free lists hold no duplicates."""
    owned: list[int] = []
    for state in group.requests.values():
        owned += state.required_pages
        owned += state.page_map[state.page_map >= 0].tolist()
    assert len(owned) == len(set(owned)), f"I6: pages owned twice: {sorted(owned)}"
    assert set(owned) == set(group.pages.kind), (
        f"I6: owned {sorted(owned)} != allocated {sorted(group.pages.kind)}"
    )
    free = list(group.pages.free_ids)
    assert len(free) == len(set(free)) and not set(free) & set(owned), "I6: free list"
    assert len(free) + len(owned) == group.config.num_pages, "I6: pages do not balance"
    arena = group.staging
    locs = arena.all_locs()
    assert sorted(locs) == list(range(arena.base_row, arena.base_row + arena.capacity)), (
        "I6: staging rows do not balance"
    )
    for e in arena.staged.values():
        assert e.request_id in group.requests, f"I6: staged row of released {e.request_id!r}"


def assert_all(group: SourceGroup, truth: Truth) -> None:
    """Every state invariant (I1, I2, I3 on device state, I4, I6)."""
    assert_recoverable(group)
    assert_capacity(group)
    assert_exact(group, truth)
    assert_ordering(group)
    assert_no_leak(group)
