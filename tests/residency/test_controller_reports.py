"""Worker reports on the controller (no gRPC): a request released already or an ack of a
command unknown here are skipped and the rest of the report applied; an ack given twice,
another worker's request or command are refused only after the report's other items were
applied."""

from __future__ import annotations

import pytest

from services.common.errors import FailedPrecondition
from services.residency.config import ResidencyConfig
from services.residency.controller import ResidencyController
from services.residency.core import AdmitSpec, WorkerSpec
from services.residency.core.invariants import check_all


def controller() -> ResidencyController:
    c = ResidencyController(ResidencyConfig(port=0, populate_inflight=0))
    c.open_session(WorkerSpec("w0", 100, 10), ())
    c.open_session(WorkerSpec("w1", 100, 10), ())
    for rid, wid in (("r1", "w0"), ("r2", "w0"), ("r3", "w0"), ("x1", "w1")):
        assert c.core.admit(AdmitSpec(rid, 10, worker_id=wid)).grant is not None
    return c


def test_a_request_released_already_is_skipped_and_the_rest_freed() -> None:
    c = controller()
    session = c._sessions["w0"]
    c.release("r1")  # the Release RPC got there first
    c.report(session, acks=[], released=["r1", "r2", "ghost"])
    assert set(c.core.requests) == {"r3", "x1"}  # r2 freed although r1 and ghost were stale
    check_all(c.core)
    c.report(session, acks=[], released=["r3"])  # the session still works
    assert set(c.core.requests) == {"x1"}


def test_another_workers_request_is_refused_after_the_rest_is_freed() -> None:
    c = controller()
    with pytest.raises(FailedPrecondition, match="x1 is on worker w1, not w0"):
        c.report(c._sessions["w0"], acks=[], released=["x1", "r2"])
    assert set(c.core.requests) == {"r1", "r3", "x1"}  # r2 freed, x1 untouched
    check_all(c.core)


def test_unknown_and_repeated_acks_do_not_drop_the_rest_of_the_report() -> None:
    """An ack of a command this controller never issued (an earlier incarnation's) is
    skipped; one given twice is refused, but only after the report's other acks and
    finished requests were applied."""
    c = ResidencyController(ResidencyConfig(port=0, populate_inflight=1))
    s = c.open_session(WorkerSpec("w0", 100, 10), ())
    c.core.admit(AdmitSpec("r2", 10, worker_id="w0"))
    c.core.admit(AdmitSpec("r4", 10, worker_id="w0"))
    c.core.admit(AdmitSpec("r1", 10, history_pages=200, worker_id="w0"))
    c.core.admit(AdmitSpec("r3", 10, worker_id="w0"))  # no room: r1's history is backed up
    c._flush()
    sent = []
    while not s.queue.empty():
        sent.append(s.queue.get_nowait())
    assert sent, "a Backup command was expected"
    first = sent[0].command_id
    c.report(s, acks=[(first, True)])
    c.report(s, acks=[(10_000, True)], released=["r2"])  # unknown id: skipped, no error
    assert "r2" not in c.core.requests
    with pytest.raises(FailedPrecondition, match="acknowledged already"):
        c.report(s, acks=[(first, True)], released=["r4"])
    assert "r4" not in c.core.requests  # freed although the report carried a bad ack
    check_all(c.core)


def test_an_ack_for_another_workers_command_is_refused_after_the_rest() -> None:
    c = ResidencyController(ResidencyConfig(port=0, populate_inflight=1))
    s0 = c.open_session(WorkerSpec("w0", 100, 10), ())
    c.open_session(WorkerSpec("w1", 100, 10), ())
    c.core.admit(AdmitSpec("r", 10, worker_id="w0"))
    c.core.admit(AdmitSpec("x2", 10, worker_id="w1"))
    c.core.admit(AdmitSpec("x1", 10, history_pages=200, worker_id="w1"))
    c.core.admit(AdmitSpec("x3", 10, worker_id="w1"))  # no room on w1: a Backup goes to w1
    c._flush()
    foreign = [cmd.command_id for cmd in c.core.pending_commands("w1")]
    assert foreign, "a command to w1 was expected"
    with pytest.raises(FailedPrecondition, match="was sent to worker w1, not w0"):
        c.report(s0, acks=[(foreign[0], True)], released=["r"])
    assert "r" not in c.core.requests  # the finished request was freed all the same
    assert [cmd.command_id for cmd in c.core.pending_commands("w1")] == foreign  # untouched
    check_all(c.core)


def test_a_replaced_sessions_late_report_does_not_ack_or_close_the_new_one() -> None:
    """The old stream's report, read after a newer session replaced it: its ack is not
    applied (the command was re-sent to the new session, which acks it without error),
    its finished request is still released."""
    c = ResidencyController(ResidencyConfig(port=0, populate_inflight=1))
    old = c.open_session(WorkerSpec("w0", 100, 10), ())
    c.core.admit(AdmitSpec("r2", 10, worker_id="w0"))
    c.core.admit(AdmitSpec("r1", 10, history_pages=200, worker_id="w0"))
    c.core.admit(AdmitSpec("r3", 10, worker_id="w0"))  # a Backup goes to w0
    c._flush()
    backup = [cmd.command_id for cmd in c.core.pending_commands("w0")]
    assert backup
    new = c.open_session(WorkerSpec("w0", 100, 10), ())
    c.report(old, acks=[(backup[0], True)], released=["r2"])  # late, from the old stream
    assert "r2" not in c.core.requests
    assert backup[0] in [cmd.command_id for cmd in c.core.pending_commands("w0")]
    c.report(new, acks=[(backup[0], True)])  # the re-sent command, acked once: no error
    assert c.alive("w0")
    check_all(c.core)


def test_release_of_an_empty_request_id_is_invalid() -> None:
    from services.common.errors import InvalidArgument

    c = controller()
    with pytest.raises(InvalidArgument, match="request_id is empty"):
        c.release("")
