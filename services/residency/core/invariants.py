"""Named invariant checkers for the residency core (tests call them after every step).

Each recomputes from first principles instead of trusting the core's running sums or
its own policy functions, and raises AssertionError naming what broke.
"""

from __future__ import annotations

from services.residency.core.model import CommandKind, ReclaimOrder
from services.residency.core.residency import ResidencyCore
from services.residency.core.trace import Candidate


def assert_capacity(core: ResidencyCore) -> None:
    """I2 / eq. 3: ``M_req + M_opt + M_res ≤ M`` on every worker; slots within bounds."""
    for wid, w in core.workers.items():
        req = sum(e.required for e in w.requests.values())
        opt = sum(e.allocated for e in w.requests.values())
        m, res = w.spec.capacity_pages, w.spec.reserve_pages
        assert req + opt + res <= m, f"{wid}: M_req={req} + M_opt={opt} + M_res={res} > M={m}"
        assert len(w.requests) <= w.spec.request_slots, f"{wid}: slots over capacity"


def assert_no_page_leak(core: ResidencyCore) -> None:
    """I6: running sums equal recomputed ones; every page and command has one owner."""
    seen = set()
    for wid, w in core.workers.items():
        entries = list(w.requests.values())
        for name in ("required", "allocated", "ready", "history"):
            attr = "history" if name == "history" else name
            total = sum(getattr(e, attr) for e in entries)
            assert getattr(w, name) == total, f"{wid}: {name} sum {getattr(w, name)} != {total}"
        populating = 0
        for e in entries:
            assert e.worker_id == wid and core.requests.get(e.request_id) is e, e.request_id
            assert 0 <= e.ready <= e.allocated <= e.history, f"{e.request_id}: page bounds {e}"
            assert 0 <= e.backed <= e.history and 0 <= e.retire_pages <= e.allocated, e
            cmd = core.commands.get(e.pending) if e.pending is not None else None
            assert (e.pending is None) == (cmd is None), f"{e.request_id}: dangling command"
            is_pop = cmd is not None and cmd.kind is CommandKind.POPULATE
            populating += is_pop
            unready = cmd.pages if is_pop else 0
            assert e.allocated - e.ready == unready, f"{e.request_id}: unready pages leak"
            seen.add(e.request_id)
        assert w.populating == populating, f"{wid}: populating {w.populating} != {populating}"
    assert seen == set(core.requests), "request index out of sync with the ledgers"
    for cid, cmd in core.commands.items():
        e = core.requests.get(cmd.request_id)
        assert e is not None and e.pending == cid, f"command {cid} without its request"


def assert_recoverable(core: ResidencyCore) -> None:
    """I1 at page granularity: every history page is ready on the device or backed."""
    for rid, e in core.requests.items():
        assert e.ready + e.backed >= e.history, f"{rid}: ready={e.ready} backed={e.backed}"


def _walk_key(c: Candidate, order: ReclaimOrder) -> tuple[int, ...]:
    return {
        ReclaimOrder.BACKED_LARGEST: (not c.fully_backed, -c.pages, c.seq),
        ReclaimOrder.LARGEST: (-c.pages, c.seq),
        ReclaimOrder.OLDEST: (c.seq,),
        ReclaimOrder.NEWEST: (-c.seq,),
    }[order]


def assert_reclaim_minimal(core: ResidencyCore) -> None:
    """Eq. 4: each selection walked the candidates in the configured order and took the
    first q whose optional pages cover Δ, and no more (every prefix shorter fell short)."""
    for d in core.reclaim_log:
        walk = sorted(d.candidates, key=lambda c: _walk_key(c, d.order))
        assert [c.request_id for c in walk] == [c.request_id for c in d.candidates], \
            f"{d.worker_id}: candidates not in {d.order.value} order"
        q = len(d.chosen)
        assert list(d.chosen) == [c.request_id for c in walk[:q]], "not a prefix of the walk"
        assert sum(c.pages for c in walk[:q]) >= d.deficit, f"Δ={d.deficit} not covered"
        assert q == 0 or sum(c.pages for c in walk[:q - 1]) < d.deficit, "took more than q'"
        assert all(c.pages > 0 for c in walk), "a candidate without optional pages"


def assert_backup_before_retire(core: ResidencyCore) -> None:
    """I4: no Retire is issued for a request whose history lacks a host copy; replays the
    trace (a Backup ack backs the request) and checks in-flight Retires."""
    backed: dict[str, bool] = {}
    for ev in core.trace:
        if ev.kind in ("admit", "adopt"):
            backed[ev.request_id] = ev.fully_backed
        elif ev.kind in ("release", "drop"):
            backed.pop(ev.request_id, None)
        elif ev.kind == "ack" and ev.command is CommandKind.BACKUP and ev.ok:
            backed[ev.request_id] = True
        elif ev.kind == "issue" and ev.command is CommandKind.RETIRE:
            assert backed.get(ev.request_id, ev.fully_backed), \
                f"Retire {ev.command_id} of {ev.request_id} before its Backup completed"
    for cmd in core.commands.values():
        if cmd.kind is CommandKind.RETIRE:
            assert core.requests[cmd.request_id].fully_backed, f"Retire {cmd.command_id}"


def check_all(core: ResidencyCore) -> None:
    assert_capacity(core)
    assert_no_page_leak(core)
    assert_recoverable(core)
    assert_reclaim_minimal(core)
    assert_backup_before_retire(core)
