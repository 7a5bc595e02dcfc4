"""Worker reports on the controller (no gRPC): a request released already is skipped and
the rest of the report applied; a request of another worker is refused only after the
report's other finished requests were freed."""

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
