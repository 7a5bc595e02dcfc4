"""Per-request state of one source group: tail, hot cache, optional-history map, backing.

All tensors live on the group's device (the kernels read them); ``B = hot_slots``,
``T = tail_rows``, ``P = ceil(max_rows / page_rows)`` logical pages of the history::

    hot_rows     int64 [B]  source row held by each hot slot, -1 = empty
    hot_stamp    int64 [B]  epoch of the slot's last use (0 = never): the LRU order, and
                            the slot's protection: it is protected while hot_stamp >
                            group.finished_epoch. A resolve stamps the slots it returns with
                            its epoch; promotion stamps a slot only with an epoch whose
                            readers finished (release_staging's precondition), so a promoted
                            slot is not protected, as before it was promoted
    hot_locs     int64 [B]  pool row of each hot slot (fixed at admission)
    hot_index    int64 [max_rows]  the inverse of hot_rows: hot_locs[s] << 20 | s for the
                            slot s holding the row, -1 for a row no slot holds (derived
                            state, kept by every writer of hot_rows; the CUDA lookup
                            finds a hit with one load instead of scanning the B slots)
    hot_rank     int64 [RANK_HEAD + B + 3 ceil(max_rows / 128), each part rounded up to even]  the
                            CUDA lookup's cache of the held rows (derived state, never read by
                            the reference): a header (RANK_VERSION: bumped by every writer of
                            hot_rows; RANK_BUILT: the version the cache was built at;
                            RANK_WORDS: the bitmap words it covers), the held rows' hot_index
                            entries in ascending row order, then a bitmap of the held rows (u32
                            words) and its exclusive prefix of set bits (a u16 per word: a
                            row's rank among the held rows, its word's prefix plus the set bits
                            below it, finds its entry). Valid while RANK_BUILT == RANK_VERSION
                            (kernels/resolver_rank.cuh).
    tail_locs    int64 [T]  pool row of each tail ring slot; row s lives at tail_locs[s % T]
    page_map     int64 [P]  physical page holding logical page g (rows g*p .. g*p+p-1), -1
    page_ready   bool  [P]  True once the page's copy completed (only ready pages resolve)
    map_hi       int        pages at or past it hold no physical page (page_map -1, so not
                            ready either): a host-side bound that only grows, raised by every
                            writer of page_map; the CUDA lookup loads neither tensor past it

Row ranges (``n = committed``)::

    0 ........ eligible*p ........ tail_lo ........ n ........ tail_hi
    | imported full pages |  generated, immutable |  tail ring (≤ T rows)       |
    | (optional residency)|  (host + hot cache)   |  committed | unverified     |

Rows ``[tail_lo, tail_hi)`` are in the tail; ``tail_lo`` is a multiple of ``page_rows``
and only advances after the completed pages below it are backed up (offload policies) or
moved into history pages (``resident``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from services.common.backing import HostBacking


@dataclass(slots=True, eq=False)
class RequestState:
    request_id: str
    max_rows: int
    eligible_pages: int  # full pages of imported history (optional residency candidates)
    committed: int
    tail_lo: int
    tail_hi: int
    hot_rows: torch.Tensor
    hot_stamp: torch.Tensor
    hot_locs: torch.Tensor
    hot_index: torch.Tensor
    hot_rank: torch.Tensor
    tail_locs: torch.Tensor
    page_map: torch.Tensor
    page_ready: torch.Tensor
    required_pages: list[int]
    backings: list[HostBacking] = field(default_factory=list)
    last_read_epoch: int = 0
    read_tail_lo: int = 0  # the tail [read_tail_lo, read_tail_hi) unfinished readers may
    read_tail_hi: int = 0  # hold slots of (SourceGroup.note_read, open_rows)
    map_hi: int = 0  # no page at or past it is mapped (see the module's docstring)

    @property
    def tail_span(self) -> int:
        return self.tail_hi - self.tail_lo

    def mapped_pages(self) -> list[int]:
        """Logical pages that hold a physical page (ready or not)."""
        return torch.nonzero(self.page_map >= 0).flatten().tolist()

    def optional_logical_pages(self) -> list[int]:
        """Mapped logical pages of imported history (a_r of eq. 4 = their count)."""
        return [g for g in self.mapped_pages() if g < self.eligible_pages]


def new_request_state(
    request_id: str,
    max_rows: int,
    eligible_pages: int,
    imported_rows: int,
    required_pages: list[int],
    hot_slots: int,
    tail_rows: int,
    page_rows: int,
    device: torch.device,
) -> RequestState:
    """Lay out a fresh request: hot cache first, then the tail, in ``required_pages``."""
    rows = torch.tensor(required_pages, dtype=torch.int64, device=device)
    rows = (rows[:, None] * page_rows + torch.arange(page_rows, device=device)).flatten()
    num_logical = -(-max_rows // page_rows)
    hot_pages = -(-hot_slots // page_rows) if hot_slots else 0
    tail_lo = imported_rows // page_rows * page_rows
    return RequestState(
        request_id=request_id,
        max_rows=max_rows,
        eligible_pages=eligible_pages,
        committed=imported_rows,
        tail_lo=tail_lo,
        tail_hi=imported_rows,
        hot_rows=torch.full((hot_slots,), -1, dtype=torch.int64, device=device),
        hot_stamp=torch.zeros(hot_slots, dtype=torch.int64, device=device),
        hot_locs=rows[:hot_slots].clone(),
        hot_index=torch.full((max_rows if hot_slots else 0,), -1, dtype=torch.int64, device=device),
        hot_rank=new_rank_cache(max_rows, hot_slots, device),
        tail_locs=rows[hot_pages * page_rows : hot_pages * page_rows + tail_rows].clone(),
        page_map=torch.full((num_logical,), -1, dtype=torch.int64, device=device),
        page_ready=torch.zeros(num_logical, dtype=torch.bool, device=device),
        required_pages=list(required_pages),
    )


HOT_SLOT_BITS = 20  # hot_index packs (pool row << 20 | slot); slots stay below 2^20
# hot_rank's header (int64 values), then the entries, then the bitmap (u32 words), then its
# prefix (a u16 per bitmap word)
RANK_VERSION, RANK_BUILT, RANK_WORDS, RANK_HEAD = 0, 1, 2, 4


def rank_words(max_rows: int) -> int:
    """u32 words of a hot_rank bitmap over ``max_rows`` rows, rounded up to 16-byte groups."""
    return -(-max_rows // 128) * 4


def rank_layout(max_rows: int, hot_slots: int) -> tuple[int, int, int, int]:
    """hot_rank's (entries offset, bitmap offset, prefix offset, length) in int64 values: the
    entries rounded up to an even count keep the bitmap 16-byte aligned, the bitmap's whole
    16-byte groups the prefix (a u16 per bitmap word), and the prefix rounded up to 16 bytes
    the next cache of a ``[batch, length]`` tensor (the benchmark's)."""
    bits = RANK_HEAD + hot_slots + (hot_slots & 1)
    prefix = bits + rank_words(max_rows) // 2
    return RANK_HEAD, bits, prefix, prefix + -(-rank_words(max_rows) // 8) * 2


def new_rank_cache(max_rows: int, hot_slots: int, device: torch.device, batch: int = 0
                   ) -> torch.Tensor:
    """Empty, invalid hot_rank caches (built at version -1; none when B = 0): one, or
    ``[batch, length]`` (the benchmark's states)."""
    if not hot_slots:
        return torch.zeros(0, dtype=torch.int64, device=device)
    length = rank_layout(max_rows, hot_slots)[3]
    out = torch.zeros((batch, length) if batch else (length,), dtype=torch.int64, device=device)
    out[..., RANK_BUILT] = -1
    return out


def rank_cache_contents(state: RequestState, words: int
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a hot_rank cache covering ``words`` bitmap words holds (the torch reference of
    resolver_rank.cuh's build): the hot_index entries of the held rows below 32 ``words``
    in ascending row order, the bitmap of those rows (int64 [words], each a u32 word) and
    its exclusive prefix of set bits (int64 [words], each a u16: a held row's rank is its
    word's prefix plus the set bits below it in the word)."""
    rows = state.hot_rows
    slots = torch.nonzero((rows >= 0) & (rows < 32 * words)).flatten()
    order = rows[slots].argsort()
    slots, held = slots[order], rows[slots][order]
    bits = torch.zeros(32 * words, dtype=torch.int64, device=rows.device)
    bits[held] = 1
    per_word = bits.view(words, 32)
    shifts = torch.arange(32, dtype=torch.int64, device=rows.device)
    counts = per_word.sum(1)
    return hot_entries(state, slots), (per_word << shifts).sum(1), counts.cumsum(0) - counts


def bump_hot(state: RequestState, changed: torch.Tensor | int = 1) -> None:
    """hot_rows changed (``changed``: a device bool or count, read by no host): the lookup's
    cache (hot_rank) is stale."""
    if state.hot_rank.numel():
        state.hot_rank[RANK_VERSION] += changed


def hot_entries(state: RequestState, slots: torch.Tensor) -> torch.Tensor:
    """``hot_index`` values of ``slots``: their pool rows << HOT_SLOT_BITS | slot."""
    return state.hot_locs[slots] << HOT_SLOT_BITS | slots


def set_hot_rows(state: RequestState, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """``hot_rows[slots] = rows`` with ``hot_index`` kept its inverse: the rows the slots
    held leave the index, then ``rows`` enter it. ``slots`` distinct, ``rows`` distinct
    and held by no other slot (invariant I4)."""
    old = state.hot_rows[slots]
    state.hot_index[old[old >= 0]] = -1
    state.hot_rows[slots] = rows
    state.hot_index[rows] = hot_entries(state, slots)
    bump_hot(state)


def set_hot_rows_where(state: RequestState, slots: torch.Tensor, rows: torch.Tensor,
                       valid: torch.Tensor) -> None:
    """``set_hot_rows`` of the ``valid`` pairs only, without reading the device (no mask
    indexing): the index moves by added differences, zero for the others, so the pairs
    left out may all point at row 0. Same premises as ``set_hot_rows``."""
    old = state.hot_rows[slots]
    gone = valid & (old >= 0)
    at = torch.where(gone, old, 0)
    gone_delta = torch.where(gone, -1 - state.hot_index[at], 0)
    state.hot_index.index_put_((at,), gone_delta, accumulate=True)
    at = torch.where(valid, rows, 0)
    new = torch.where(valid, hot_entries(state, slots) - state.hot_index[at], 0)
    state.hot_index.index_put_((at,), new, accumulate=True)
    state.hot_rows[slots] = torch.where(valid, rows, old)
    bump_hot(state, valid.any())  # stale only where a pair moved


def reindex_hot(state: RequestState) -> None:
    """Rebuild ``hot_index`` from ``hot_rows`` (for code that wrote ``hot_rows`` directly).
    Rows held by two slots (I4 broken) keep one of them."""
    state.hot_index.fill_(-1)
    held = torch.nonzero(state.hot_rows >= 0).flatten()
    state.hot_index[state.hot_rows[held]] = hot_entries(state, held)
    bump_hot(state)


def lru_order(stamp: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Slots where ``candidates`` is True, in eviction order.

    Tie-breaking (kernels reproduce it bit-exactly): smallest stamp first, then smallest
    slot index. Empty slots have stamp 0 and so go first, in slot order.
    """
    slots = torch.nonzero(candidates).flatten()
    order = torch.argsort(stamp[slots], stable=True)  # stable: ties keep slot order
    return slots[order]
