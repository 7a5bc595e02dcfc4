"""Exact expectations of the residency core: which requests are reclaimed for a given Δ,
FIFO order, deadlines, the populate round robin, command acks, placement."""

from __future__ import annotations

import pytest

from services.common.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from services.residency.core import (
    AdmitSpec,
    CommandKind,
    PolicyConfig,
    PolicyKind,
    ReclaimOrder,
    RequestReport,
    ResidencyCore,
    TicketState,
    WorkerSpec,
)
from services.residency.core.invariants import check_all
from services.residency.core.policy import select_eq4
from tests.residency.helpers import FakeClock, fingerprint, pump

NO_POPULATE = dict(populate_inflight=0, trace_limit=10_000)

# A full worker: M=100, M_res=10, 15 required + 75 optional pages = 90 (free 0).
#   A: 30 optional, unbacked   B: 20 optional, backed   C: 25 optional, unbacked
FULL = [RequestReport("A", 5, 30, 30, 0), RequestReport("B", 5, 20, 20, 20),
        RequestReport("C", 5, 25, 25, 0)]


def full_core(order: ReclaimOrder = ReclaimOrder.BACKED_LARGEST, **kw) -> ResidencyCore:
    core = ResidencyCore(PolicyConfig(reclaim_order=order, **{**NO_POPULATE, **kw}))
    core.register_worker(WorkerSpec("w0", 100, 10), FULL)
    return core


def test_select_eq4_takes_the_shortest_covering_prefix() -> None:
    assert select_eq4([30, 20, 25], 0) == 0
    assert select_eq4([30, 20, 25], 30) == 1
    assert select_eq4([30, 20, 25], 31) == 2
    assert select_eq4([30, 20, 25], 75) == 3
    assert select_eq4([30, 20, 25], 76) is None
    assert select_eq4([], 1) is None


@pytest.mark.parametrize(("order", "deficit", "reclaimed"), [
    (ReclaimOrder.BACKED_LARGEST, 15, ("B",)),          # backed first: no backup needed
    (ReclaimOrder.BACKED_LARGEST, 21, ("B", "A")),
    (ReclaimOrder.LARGEST, 15, ("A",)),
    (ReclaimOrder.LARGEST, 45, ("A", "C")),             # B keeps its pages
    (ReclaimOrder.OLDEST, 45, ("A", "B")),
    (ReclaimOrder.NEWEST, 26, ("C", "B")),
    (ReclaimOrder.NEWEST, 75, ("C", "B", "A")),
])
def test_reclaim_takes_first_q_requests_in_order(order, deficit, reclaimed) -> None:
    core = full_core(order)
    ticket = core.admit(AdmitSpec("D", deficit))
    assert ticket.state is TicketState.WAITING and ticket.reclaimed == reclaimed
    assert {e.request_id for e in core.requests.values() if e.retire_pages} == set(reclaimed)
    check_all(core)
    done = pump(core, "w0")
    expect = []
    for rid in reclaimed:
        pages = {r.request_id: r for r in FULL}[rid]
        if not pages.backed_pages:
            expect.append(("backup", rid, pages.history_pages))
    assert sorted(d for d in done if d[0] == "backup") == sorted(expect)
    assert sorted(d[1] for d in done if d[0] == "retire") == sorted(reclaimed)
    assert ticket.state is TicketState.GRANTED
    assert ticket.grant.reclaimed == reclaimed
    untouched = set("ABC") - set(reclaimed)
    assert all(core.request(r).allocated == {x.request_id: x for x in FULL}[r].optional_pages
               for r in untouched)
    check_all(core)


def test_backup_precedes_retire_and_acks_are_checked() -> None:
    core = full_core(ReclaimOrder.LARGEST)
    core.admit(AdmitSpec("D", 10))
    [backup] = core.take_commands("w0")
    assert (backup.kind, backup.request_id, backup.pages) == (CommandKind.BACKUP, "A", 30)
    assert core.take_commands("w0") == []          # no Retire before the Backup ack
    before = fingerprint(core)
    with pytest.raises(FailedPrecondition, match="sent to worker w0, not w9"):
        core.ack(backup.command_id, "w9")
    with pytest.raises(NotFound, match="command_id=999"):
        core.ack(999)
    assert fingerprint(core) == before
    core.ack(backup.command_id, "w0")
    [retire] = core.take_commands("w0")
    assert (retire.kind, retire.request_id, retire.pages) == (CommandKind.RETIRE, "A", 30)
    before = fingerprint(core)
    with pytest.raises(FailedPrecondition, match="acknowledged already"):
        core.ack(backup.command_id)
    assert fingerprint(core) == before
    core.ack(retire.command_id)
    assert core.request("D").required == 10 and core.request("A").allocated == 0
    check_all(core)


def test_uncoverable_deficit_waits_without_disturbing_anyone() -> None:
    core = full_core()
    ticket = core.admit(AdmitSpec("D", 80))        # free 0 + optional 75 < 80
    assert ticket.state is TicketState.WAITING and core.take_commands("w0") == []
    core.release("A")                              # frees 35: now 35 free + 45 optional
    assert ticket.reclaimed == ("B", "C")
    pump(core, "w0")
    assert ticket.state is TicketState.GRANTED
    check_all(core)


def test_fifo_head_blocks_later_admissions() -> None:
    core = ResidencyCore(PolicyConfig(**NO_POPULATE))
    core.register_worker(WorkerSpec("w0", 100, 0), [RequestReport("X", 60, 0)])
    big = core.admit(AdmitSpec("big", 50))
    small = core.admit(AdmitSpec("small", 10))     # would fit, but FIFO
    assert (big.state, small.state) == (TicketState.WAITING, TicketState.WAITING)
    assert [t.spec.request_id for t in core.waiting] == ["big", "small"]
    core.release("X")
    assert (big.state, small.state) == (TicketState.GRANTED, TicketState.GRANTED)
    check_all(core)


def test_deadline_expiry_and_cancel() -> None:
    clock = FakeClock()
    resolved = []
    core = ResidencyCore(PolicyConfig(**NO_POPULATE), clock, on_resolved=resolved.append)
    core.register_worker(WorkerSpec("w0", 10), [RequestReport("X", 10, 0)])
    t1 = core.admit(AdmitSpec("a", 5), deadline=clock.now + 1.0)
    t2 = core.admit(AdmitSpec("b", 5), deadline=clock.now + 5.0)
    t3 = core.admit(AdmitSpec("c", 5))
    clock.advance(1.0)
    assert core.expire() == [t1] and t1.state is TicketState.EXPIRED
    assert core.cancel(t3) and t3.state is TicketState.CANCELLED and not core.cancel(t3)
    clock.advance(0.5)
    core.release("X")
    assert t2.state is TicketState.GRANTED and t2.grant.waited_s == pytest.approx(1.5)
    assert resolved == [t1, t2]
    assert core.expire() == []


def test_populate_round_robin_sequence() -> None:
    core = ResidencyCore(PolicyConfig(populate_pages=4, populate_inflight=1, trace_limit=1000))
    reports = [RequestReport(r, 1, 10, 0, 10) for r in "ABC"]   # history all on host
    core.register_worker(WorkerSpec("w0", 100), reports)
    assert pump(core, "w0") == [
        ("populate", "A", 4), ("populate", "B", 4), ("populate", "C", 4),
        ("populate", "A", 4), ("populate", "B", 4), ("populate", "C", 4),
        ("populate", "A", 2), ("populate", "B", 2), ("populate", "C", 2)]
    assert core.worker("w0").coverage == 1.0 and core.worker("w0").populated_total == 30
    check_all(core)


def test_populate_is_bounded_by_free_pages_and_waits_for_the_queue() -> None:
    core = ResidencyCore(PolicyConfig(populate_pages=8, populate_inflight=2, trace_limit=100))
    core.register_worker(WorkerSpec("w0", 30, 2), [RequestReport("A", 5, 30, 0, 30),
                                                   RequestReport("B", 5, 30, 0, 30),
                                                   RequestReport("C", 5, 30, 0, 30)])
    [c1, c2] = core.take_commands("w0")             # 13 free pages: 8 then 5, C waits
    assert [(c.request_id, c.pages) for c in (c1, c2)] == [("A", 8), ("B", 5)]
    assert core.worker("w0").free_pages == 0
    waiting = core.admit(AdmitSpec("big", 15))      # A and B are busy populating
    core.release("B")                               # 10 free, but an admission waits
    assert waiting.reclaimed == () and core.take_commands("w0") == []
    check_all(core)
    core.ack(c1.command_id)                          # A's 8 pages become reclaimable
    assert waiting.reclaimed == ("A",)
    pump(core, "w0", (CommandKind.RETIRE,))
    assert waiting.state is TicketState.GRANTED
    check_all(core)


def test_resident_first_admission_keeps_history_while_spare() -> None:
    core = ResidencyCore(PolicyConfig(**NO_POPULATE))
    core.register_worker(WorkerSpec("w0", 100, 10))
    g1 = core.admit(AdmitSpec("a", 10, 50)).grant
    g2 = core.admit(AdmitSpec("b", 10, 50)).grant
    assert (g1.optional_pages, g2.optional_pages) == (50, 20)
    assert core.request("b").backed == 30          # the 30 pages not kept go to host
    check_all(core)


def test_placement_prefers_a_worker_with_free_pages_then_most_headroom() -> None:
    core = ResidencyCore(PolicyConfig(**NO_POPULATE))
    core.register_worker(WorkerSpec("w0", 100), [RequestReport("A", 10, 90, 90, 0)])
    core.register_worker(WorkerSpec("w1", 50), [RequestReport("B", 30, 0)])
    core.register_worker(WorkerSpec("w2", 60), [RequestReport("C", 30, 0)])
    assert core.admit(AdmitSpec("x", 15)).grant.worker_id == "w2"   # fits, most free (30)
    assert core.admit(AdmitSpec("y", 15)).grant.worker_id == "w1"   # 20 free vs w2's 15
    z = core.admit(AdmitSpec("z", 40))             # fits nowhere: reclaim on w0
    assert z.pledged_worker == "w0" and z.reclaimed == ("A",)
    pinned = ResidencyCore(PolicyConfig(**NO_POPULATE))
    pinned.register_worker(WorkerSpec("w0", 10))
    pinned.register_worker(WorkerSpec("w1", 100))
    assert pinned.admit(AdmitSpec("p", 5, worker_id="w0")).grant.worker_id == "w0"


def test_dead_worker_frees_its_ledger_and_waiters_move() -> None:
    core = ResidencyCore(PolicyConfig(**NO_POPULATE))
    core.register_worker(WorkerSpec("w0", 100), [RequestReport("A", 10, 90, 90, 0)])
    t = core.admit(AdmitSpec("z", 40))
    assert t.pledged_worker == "w0"
    [backup] = core.take_commands("w0")
    assert core.remove_worker("w0") == ["A"]
    assert core.requests == {} and core.commands == {} and t.state is TicketState.WAITING
    assert core.ack(backup.command_id) is None     # a late ack of a cancelled command
    with pytest.raises(FailedPrecondition, match="acknowledged already"):
        core.ack(backup.command_id)
    core.register_worker(WorkerSpec("w1", 100))
    assert t.state is TicketState.GRANTED and t.grant.worker_id == "w1"
    check_all(core)


def test_release_cancels_in_flight_command_and_late_ack_is_harmless() -> None:
    core = full_core(ReclaimOrder.LARGEST)
    core.admit(AdmitSpec("D", 10))
    [backup] = core.take_commands("w0")
    core.release("A")
    assert core.ack(backup.command_id) is None      # cancelled meanwhile
    with pytest.raises(FailedPrecondition):
        core.ack(backup.command_id)
    assert core.request("D").worker_id == "w0"
    check_all(core)


def test_bad_input_changes_nothing() -> None:
    core = full_core()
    core.admit(AdmitSpec("W", 50))
    before = fingerprint(core)
    bad = [
        (InvalidArgument, "required_pages=-1", lambda: core.admit(AdmitSpec("x", -1))),
        (InvalidArgument, "history_pages=-3", lambda: core.admit(AdmitSpec("x", 1, -3))),
        (InvalidArgument, "exceeds the largest admittable pool .* 90",
         lambda: core.admit(AdmitSpec("x", 91))),
        (NotFound, "worker_id='nope'", lambda: core.admit(AdmitSpec("x", 1, worker_id="nope"))),
        (AlreadyExists, "'A'", lambda: core.admit(AdmitSpec("A", 1))),
        (AlreadyExists, "'W'", lambda: core.admit(AdmitSpec("W", 1))),
        (NotFound, "request_id='nope'", lambda: core.release("nope")),
        (NotFound, "worker_id='nope'", lambda: core.remove_worker("nope")),
        (AlreadyExists, "capacity_pages", lambda: core.register_worker(WorkerSpec("w0", 99, 10))),
        (InvalidArgument, "capacity_pages=-5", lambda: core.register_worker(WorkerSpec("w5", -5))),
        (InvalidArgument, "reserve_pages=10 out of range",
         lambda: core.register_worker(WorkerSpec("w5", 10, 10))),
        (InvalidArgument, "exceed capacity",
         lambda: core.register_worker(WorkerSpec("w5", 10), [RequestReport("q", 11, 0)])),
        (AlreadyExists, "admitted on worker w0",
         lambda: core.register_worker(WorkerSpec("w5", 10), [RequestReport("A", 1, 0)])),
        (InvalidArgument, "neither on the device nor backed",
         lambda: core.register_worker(WorkerSpec("w5", 10), [RequestReport("q", 1, 5, 2, 2)])),
    ]
    for exc, match, call in bad:
        with pytest.raises(exc, match=match):
            call()
        assert fingerprint(core) == before, match
    check_all(core)


def test_elastic_form_trims_every_request_to_its_target() -> None:
    core = ResidencyCore(PolicyConfig(policy=PolicyKind.ELASTIC, base_pages=2, alpha_min=0.1,
                                      **NO_POPULATE))
    core.register_worker(WorkerSpec("w0", 110, 10), [RequestReport("A", 10, 40, 40, 0),
                                                     RequestReport("B", 10, 40, 40, 40)])
    # Registration already enforces targets: α = 1 − 20/100 = 0.8 → 2 + ⌊0.8·38⌋ = 32.
    assert pump(core, "w0") == [("retire", "B", 8), ("backup", "A", 40), ("retire", "A", 8)]
    t = core.admit(AdmitSpec("C", 30, 10))
    # α' = 1 − 50/100 = 0.5 → target 2 + 19 = 21: both shrink by 11 (not just one).
    assert t.state is TicketState.WAITING and sorted(t.reclaimed) == ["A", "B"]
    pump(core, "w0")
    assert t.state is TicketState.GRANTED
    assert [core.request(r).allocated for r in "AB"] == [21, 21]
    assert t.grant.optional_pages == min(10, 2 + int(0.5 * 8))
    check_all(core)

