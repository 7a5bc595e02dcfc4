"""Page operations: admit, open/commit rows, backup, retire, populate, release.

Each operation validates first and changes nothing on failure; each keeps I1-I6:

    admit     reserve required pages (hot cache + tail); resident-first: full pages of
              imported history go to optional pages (ready, host backup deferred) while
              pages are spare, the rest to host (written + committed); the partial
              boundary page goes to the tail. ``resident``: all history on device.
    open_rows reserve tail rows for this round's new rows (uncommitted until commit)
    commit    rows < committed become history; rejected rows are dropped (I5);
              completed tail pages await backup (``resident``: move into history pages)
    backup    device-only rows (completed tail pages, then unbacked optional pages)
              -> HostBacking.write for every payload layer, then commit (I4)
    retire    optional pages whose rows are backed and whose readers finished -> free
    populate  reserve free pages -> copy from host -> publish ready (bounded per call)
    release   everything of the request back to the free lists; host histories closed
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from services.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
)

from .config import is_int
from .group import SourceGroup
from .request import RequestState, new_request_state


def _count(name: str, value: object, minimum: int = 0) -> int:
    if not is_int(value) or value < minimum:
        raise InvalidArgument(f"{name}={value!r} must be an integer >= {minimum}")
    return value


def _check_history(group: SourceGroup, history: Sequence[torch.Tensor], max_rows: int) -> int:
    spec = group.spec
    if len(history) != spec.payload_layers:
        raise InvalidArgument(
            f"history has {len(history)} tensors; expected payload_layers={spec.payload_layers}"
        )
    n = history[0].shape[0] if history[0].dim() else -1
    for layer, t in enumerate(history):
        if t.dtype != torch.uint8 or t.dim() != 2 or tuple(t.shape) != (n, spec.row_bytes):
            raise InvalidArgument(
                f"history[{layer}] has dtype={t.dtype} shape={tuple(t.shape)}; expected "
                f"uint8 [n, row_bytes={spec.row_bytes}] with the same n in every layer"
            )
    if n > max_rows:
        raise InvalidArgument(f"history rows={n} exceed max_rows={max_rows}")
    return n


def admit_pages(group: SourceGroup, imported_rows: int,
                max_optional: int | None = None) -> tuple[int, int]:
    """(required pages, device history pages) that admitting ``imported_rows`` would take.

    ``max_optional`` caps the optional pages (the residency controller's grant); None
    keeps as many full history pages on the device as are spare (resident-first).
    """
    cfg = group.config
    full = imported_rows // cfg.page_rows
    required = cfg.required_pages + (full if cfg.policy == "resident" else 0)
    spare = group.pages.available - required
    optional = min(full, max(0, spare)) if cfg.policy == "adaptive" else 0
    if max_optional is not None:
        optional = min(optional, _count("max_optional", max_optional))
    return required, (full if cfg.policy == "resident" else optional)


def can_admit(group: SourceGroup, imported_rows: int) -> bool:
    required, _ = admit_pages(group, imported_rows)
    return len(group.requests) < group.config.max_requests and group.pages.can_allocate(required)


def admit(
    group: SourceGroup,
    request_id: str,
    max_rows: int,
    history: Sequence[torch.Tensor] | None = None,
    imported_rows: int = 0,
    max_optional: int | None = None,
) -> RequestState:
    """Admit ``request_id`` with capacity ``max_rows`` rows.

    history: per payload layer ``uint8 [n, row_bytes]`` (any device) imported from prefill,
    or None when the host histories already hold ``imported_rows`` backed rows.
    max_optional: cap on the history pages kept on the device (see ``admit_pages``).
    """
    cfg, p = group.config, group.config.page_rows
    if not isinstance(request_id, str) or not request_id:
        raise InvalidArgument(f"request_id={request_id!r} must be a non-empty string")
    if request_id in group.requests:
        raise AlreadyExists(f"request_id={request_id!r} is already admitted in {group.name!r}")
    _count("max_rows", max_rows, 1)
    if history is not None:
        imported_rows = _check_history(group, history, max_rows)
    elif _count("imported_rows", imported_rows) > max_rows:
        raise InvalidArgument(f"imported_rows={imported_rows} exceeds max_rows={max_rows}")
    if history is None and imported_rows and not cfg.offloads:
        raise InvalidArgument("history=None with policy='resident': no host rows to import")
    if len(group.requests) >= cfg.max_requests:
        raise ResourceExhausted(
            f"requests={len(group.requests)} at max_requests={cfg.max_requests}"
        )
    required, device_pages = admit_pages(group, imported_rows, max_optional)
    if not group.pages.can_allocate(required):
        raise ResourceExhausted(
            f"admit request_id={request_id!r} needs required pages={required} > available "
            f"pages={group.pages.available} (free={len(group.pages.free_ids)}, "
            f"reserve={cfg.reserve_pages})"
        )
    backings: list = []
    allocated: list[int] = []
    try:
        if cfg.offloads and group.provider is not None:
            row_bytes = group.spec.row_bytes
            for s in group.source_ids:
                backings.append(group.provider.open(request_id, s, row_bytes, max_rows))
        if history is None:
            for layer, backing in enumerate(backings):
                if not bool(backing.backed_mask()[:imported_rows].all()):
                    raise FailedPrecondition(
                        f"history=None but host rows [0, {imported_rows}) of layer={layer} "
                        f"are not all backed"
                    )
            history = [b.rows()[:imported_rows] for b in backings]
        kind = "required" if cfg.policy == "resident" else "optional"
        allocated = group.pages.allocate(cfg.required_pages, "required")
        state = new_request_state(
            request_id, max_rows, imported_rows // p if cfg.policy != "resident" else 0,
            imported_rows, allocated, group.hot_slots, cfg.tail_rows, p, group.device,
        )
        state.backings = backings
        device_page_ids = group.pages.allocate(device_pages, kind)
        allocated = allocated + device_page_ids
        _place_history(group, state, history, device_page_ids)
    except BaseException:
        _undo_open(group, request_id, backings, allocated)
        raise
    group.requests[request_id] = state
    return state


def _undo_open(group: SourceGroup, request_id: str, backings: list, pages: list[int]) -> None:
    """A failed admission gives back its pages and frees the histories it created; histories
    it re-attached (prefill's rows for ``history=None``) stay for a retry."""
    if pages:
        group.pages.give_back(pages)
    for sid, backing in zip(group.source_ids, backings, strict=False):
        if getattr(backing, "created", False):
            try:
                group.provider.close(request_id, sid)
            except Exception:  # the admission's own error is the one to report
                pass


def _place_history(
    group: SourceGroup, state: RequestState, history: Sequence[torch.Tensor], pages: list[int]
) -> None:
    """Imported rows: device pages first, then host (if not backed yet), tail last."""
    p, n = group.config.page_rows, state.committed
    page_t = torch.tensor(pages, dtype=torch.int64, device=group.device)
    on_device = len(pages) * p
    boundary = state.tail_lo
    tail_rows = torch.arange(boundary, n, device=group.device)
    for layer, payload in enumerate(group.payloads):
        src = history[layer]
        payload[group.page_locations(page_t)] = src[:on_device].to(group.device)
        payload[state.tail_locs[tail_rows % state.tail_locs.numel()]] = src[boundary:n].to(
            group.device
        )
        backings = state.backings
        if backings and not bool(backings[layer].backed_mask()[on_device:boundary].all()):
            backings[layer].write(on_device, src[on_device:boundary])  # device rows: one DMA
    if boundary > on_device:
        for backing in state.backings:  # commit after every layer's bytes landed (I4)
            backing.commit(on_device, boundary)
    state.page_map[: len(pages)] = page_t
    state.page_ready[: len(pages)] = True
    state.map_hi = max(state.map_hi, len(pages))


def open_rows(group: SourceGroup, request_id: str, count: int) -> torch.Tensor:
    """Reserve tail rows ``[tail_hi, tail_hi + count)``; returns their pool rows ``int64 [count]``.

    The engine writes every payload layer's new rows there: ``group.payload(l)[locs] = kv``.
    Row r takes ring slot r % tail_rows. While the request's readers are unfinished, a slot
    that held a row of the tail they resolved against is not handed out (FailedPrecondition):
    a backup or a resident commit since may have moved tail_lo past that row, or a commit
    dropped it.
    """
    state = group.request(request_id)
    stop = _open_stop(group, state, count)
    rows = torch.arange(state.tail_hi, stop, device=group.device)
    state.tail_hi = stop
    return state.tail_locs[rows % state.tail_locs.numel()]


def _open_stop(group: SourceGroup, state: RequestState, count: int) -> int:
    """``tail_hi + count`` after checking that ``count`` rows may open (changes nothing)."""
    _count("count", count, 1)
    stop = state.tail_hi + count
    if stop > state.max_rows:
        raise InvalidArgument(
            f"count={count} opens rows up to {stop} > max_rows={state.max_rows} "
            f"of request_id={state.request_id!r}"
        )
    if stop - state.tail_lo > group.config.tail_rows:
        raise ResourceExhausted(
            f"count={count} overflows the tail: rows [{state.tail_lo}, {stop}) > tail_rows="
            f"{group.config.tail_rows}; back up completed pages first"
        )
    # row r takes ring slot r % T from row r - T. Not written before the request's readers
    # finish: a slot they may hold as the location of a row that was in the tail when they
    # resolved (a backup or a resident commit moved tail_lo past it since), nor the slot of
    # a row they resolved that a commit dropped since (reopened, it would hold new bytes)
    if not group.readers_pending(state):
        return stop
    reuse_from = state.read_tail_lo + group.config.tail_rows
    whose = (f"readers of epochs {group.finished_epoch + 1}..{state.last_read_epoch} of "
             f"request_id={state.request_id!r}")
    if state.tail_hi < state.read_tail_hi:
        raise FailedPrecondition(
            f"count={count} reopens row {state.tail_hi}, dropped after {whose} resolved rows "
            f"up to {state.read_tail_hi}; open after they finish"
        )
    if stop > reuse_from:
        raise FailedPrecondition(
            f"count={count} opens rows up to {stop}, reusing the tail slots of rows from "
            f"{state.read_tail_lo} that {whose} may read; open at most "
            f"{max(0, reuse_from - state.tail_hi)} rows until they finish"
        )
    return stop


def device_ints(values: Sequence[int] | Sequence[Sequence[int]],
                device: torch.device | str) -> torch.Tensor:
    """``int64`` tensor of host ints on ``device``; on CUDA through pinned memory with a
    non-blocking copy, so building it does not wait for the device's queue."""
    t = torch.tensor(values, dtype=torch.int64)
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def open_rows_batch(group: SourceGroup, request_ids: Sequence[str],
                    counts: Sequence[int]) -> torch.Tensor:
    """``open_rows`` of several requests at once: validates every request first (nothing
    changes on failure), then reserves each one's rows; returns their pool rows
    ``int64 [sum(counts)]`` request-major (the concatenation of ``open_rows`` results)."""
    states = [group.request(rid) for rid in request_ids]
    if len(set(request_ids)) != len(states):
        raise InvalidArgument(f"request_ids={list(request_ids)!r} must be distinct")
    if len(counts) != len(states):
        raise InvalidArgument(f"counts has {len(counts)} entries for {len(states)} requests")
    index: list[int] = []
    offset = 0  # of each request's ring in the concatenation of the rings
    for state, count in zip(states, counts, strict=True):
        stop = _open_stop(group, state, count)
        size = state.tail_locs.numel()
        index.extend(offset + r % size for r in range(state.tail_hi, stop))
        offset += size
    for state, count in zip(states, counts, strict=True):
        state.tail_hi += count
    if not states:
        return torch.empty(0, dtype=torch.int64, device=group.device)
    rings = torch.cat([s.tail_locs for s in states])
    return rings[device_ints(index, group.device)]


def commit_rows(group: SourceGroup, request_id: str, committed: int) -> int:
    """Commit rows ``< committed`` and drop opened rows beyond it. Returns rows committed."""
    state, p = group.request(request_id), group.config.page_rows
    if not is_int(committed) or not state.committed <= committed <= state.tail_hi:
        raise InvalidArgument(
            f"committed={committed!r} outside [{state.committed}, {state.tail_hi}] "
            f"(committed rows .. opened rows of request_id={request_id!r})"
        )
    if group.config.policy == "resident":
        first, stop = state.tail_lo // p, committed // p
        pages = group.pages.allocate(stop - first, "required")  # raises before any change
        page_t = torch.tensor(pages, dtype=torch.int64, device=group.device)
        rows = torch.arange(first * p, stop * p, device=group.device)
        src = state.tail_locs[rows % state.tail_locs.numel()]
        for payload in group.payloads:
            payload[group.page_locations(page_t)] = payload[src]
        state.page_map[first:stop] = page_t
        state.page_ready[first:stop] = True
        state.map_hi = max(state.map_hi, stop)
        state.tail_lo = stop * p
    added = committed - state.committed
    state.committed = state.tail_hi = committed
    return added


def backup(group: SourceGroup, request_id: str, max_pages: int | None = None) -> int:
    """Back up device-only pages (tail pages first, ascending). Returns rows backed."""
    state, p = group.request(request_id), group.config.page_rows
    if not group.config.offloads:
        raise FailedPrecondition("policy='resident' has no host backing to back up to")
    budget = None if max_pages is None else _count("max_pages", max_pages, 1)
    tail_pages = list(range(state.tail_lo // p, state.committed // p))
    opt_pages = []
    if budget is None or len(tail_pages) < budget:  # tail pages alone may fill the budget
        optional = state.optional_logical_pages()
        whole = _pages_backed(group.backed_mask(state), optional, p)
        opt_pages = [g for g, ok in zip(optional, whole, strict=True) if not ok]
    pages = (tail_pages + opt_pages)[:budget]
    if not pages:
        return 0
    # every page's rows in one device gather per payload layer, written per run of
    # consecutive pages (one DMA into the host mapping and one commit per run, not one
    # per page: a 32K-row history is one run of 512 pages)
    g_t = torch.tensor(pages, dtype=torch.int64, device=group.device)
    rows = (g_t[:, None] * p + torch.arange(p, device=group.device)).flatten()
    locs = torch.where(rows >= state.tail_lo, state.tail_locs[rows % state.tail_locs.numel()],
                       state.page_map[rows // p] * p + rows % p)
    runs = _runs(pages)
    for payload, backing in zip(group.payloads, state.backings, strict=True):
        data = payload[locs]
        for at, first, n in runs:
            backing.write(first * p, data[at * p: (at + n) * p])
    for _, first, n in runs:
        for backing in state.backings:  # commit after every layer's bytes landed (I4)
            backing.commit(first * p, (first + n) * p)
    for g in pages:
        if g * p == state.tail_lo:
            state.tail_lo += p
    return len(pages) * p


def _runs(pages: list[int]) -> list[tuple[int, int, int]]:
    """``(index in pages, first page, count)`` of each maximal run of consecutive pages."""
    runs: list[tuple[int, int, int]] = []
    for i, g in enumerate(pages):
        if runs and g == runs[-1][1] + runs[-1][2]:
            at, first, n = runs[-1]
            runs[-1] = (at, first, n + 1)
        else:
            runs.append((i, g, 1))
    return runs


def _pages_backed(backed: torch.Tensor, pages: Sequence[int], p: int) -> list[bool]:
    """Whether every row of each logical page is backed (one vectorized check)."""
    if not pages:
        return []
    rows = torch.tensor(pages, dtype=torch.int64)[:, None] * p + torch.arange(p)
    return backed[rows].all(dim=1).tolist()


def retire(group: SourceGroup, request_id: str, pages: Sequence[int] | None = None) -> int:
    """Free optional pages (default: all of the request's). Returns pages retired."""
    state, p = group.request(request_id), group.config.page_rows
    optional = state.optional_logical_pages()
    targets = optional if pages is None else list(pages)
    known, seen = set(optional), set()
    for i, g in enumerate(targets):
        if not is_int(g) or g not in known:
            raise InvalidArgument(
                f"pages[{i}]={g!r} is not an optional page of request_id={request_id!r} "
                f"(optional pages: {optional})"
            )
        if g in seen:
            raise InvalidArgument(f"pages[{i}]={g} repeats an earlier page; name each page once")
        seen.add(g)
    if group.readers_pending(state):
        raise FailedPrecondition(
            f"request_id={request_id!r} has readers of epoch={state.last_read_epoch} "
            f"not finished (finished_epoch={group.finished_epoch})"
        )
    whole = _pages_backed(group.backed_mask(state), targets, p)
    for g, ok in zip(targets, whole, strict=True):
        if not ok:
            raise FailedPrecondition(
                f"page={g} (rows [{g * p}, {g * p + p})) of request_id={request_id!r} has "
                f"rows without host backing; back it up before retiring"
            )
    if not targets:
        return 0
    physical = state.page_map[torch.tensor(targets, device=group.device)].tolist()
    state.page_ready[targets] = False  # unpublish first, then free (I4)
    state.page_map[targets] = -1
    group.pages.free(physical)
    return len(targets)


def populate(group: SourceGroup, request_id: str, max_pages: int, publish: bool = True) -> int:
    """Repopulate up to ``max_pages`` missing optional pages from host. Returns pages.

    Reserve -> copy -> publish (I4). With ``publish=False`` the pages stay reserved but
    not ready (resolves keep using host + hot cache) until ``publish_pages`` is called
    after the copy completed (an async engine publishes after its copy event).
    """
    state = group.request(request_id)
    _count("max_pages", max_pages, 1)
    if group.config.policy != "adaptive":
        raise FailedPrecondition(f"policy={group.config.policy!r} has no optional residency")
    missing = torch.nonzero(state.page_map[: state.eligible_pages] < 0).flatten().tolist()
    targets = missing[: min(max_pages, group.pages.available)]
    if not targets:
        return 0
    page_t = torch.tensor(group.pages.allocate(len(targets), "optional"), device=group.device)
    tgt = torch.tensor(targets, dtype=torch.int64, device=group.device)
    state.page_map[tgt] = page_t  # reserved: mapped but not ready
    state.map_hi = max(state.map_hi, max(targets) + 1)
    rows = group.page_locations(tgt).cpu()  # logical page -> its source rows
    for payload, backing in zip(group.payloads, state.backings, strict=True):
        if not bool(backing.backed_mask()[rows].all()):
            raise RuntimeError(f"I1 violated: rows of pages {targets} are not backed")
        payload[group.page_locations(page_t)] = backing.rows()[rows].to(group.device)
    if publish:
        state.page_ready[tgt] = True  # publish after the copy completed (I4)
    return len(targets)


def publish_pages(group: SourceGroup, request_id: str) -> int:
    """Mark reserved (populated, not yet ready) pages ready. Returns pages published."""
    state = group.request(request_id)
    pending = (state.page_map >= 0) & ~state.page_ready
    state.page_ready |= pending
    return int(pending.sum())


def check_release(group: SourceGroup, request_id: str) -> None:
    """What ``release`` needs, changing nothing: NotFound, or FailedPrecondition while a
    reader or a plan of the group may still use the request's rows."""
    state = group.request(request_id)
    if group.readers_pending(state) or group.pending_layers:
        raise FailedPrecondition(
            f"request_id={request_id!r}: readers of epoch={state.last_read_epoch} not finished "
            f"(finished_epoch={group.finished_epoch}) or a plan is not applied to every layer"
        )


def release(group: SourceGroup, request_id: str) -> None:
    """Free every page, slot and staged row of the request and close its host histories."""
    check_release(group, request_id)
    _free_request(group, group.request(request_id))


def undo_admit(group: SourceGroup, request_id: str) -> None:
    """Take back an admission made a moment ago (a multi-group admission failing in a later
    group): no resolve can name the request yet, so neither earlier readers nor another
    request's pending plan stand in the way, unlike ``release``. Only the histories the
    admission created are freed; re-attached ones (prefill's) stay for a retry."""
    state = group.request(request_id)
    group.staging.drop_request(request_id)
    del group.requests[request_id]
    _undo_open(group, request_id, state.backings, _pages_of(state))


def _pages_of(state: RequestState) -> list[int]:
    """The request's pages in allocation order: required, then history pages by position."""
    return state.required_pages + state.page_map[state.page_map >= 0].tolist()


def _free_request(group: SourceGroup, state: RequestState) -> None:
    request_id = state.request_id
    group.pages.free(_pages_of(state))
    group.staging.drop_request(request_id)
    del group.requests[request_id]  # gone with its pages, whatever the closes below do
    if group.provider is not None and state.backings:
        failed: BaseException | None = None
        for sid in group.source_ids:  # every history gets its close, even after a failure
            try:
                group.provider.close(request_id, sid)
            except Exception as exc:
                failed = failed or exc
        if failed is not None:
            raise failed


def optional_pages(group: SourceGroup, request_id: str) -> int:
    """``a_r`` of eq. 4: optional pages the request would give back if reclaimed."""
    return len(group.request(request_id).optional_logical_pages())


def coverage(group: SourceGroup) -> float:
    """Ready optional history / eligible history over all requests (1.0 when none)."""
    eligible = sum(s.eligible_pages for s in group.requests.values())
    ready = sum(int(s.page_ready[: s.eligible_pages].sum()) for s in group.requests.values())
    return ready / eligible if eligible else 1.0
