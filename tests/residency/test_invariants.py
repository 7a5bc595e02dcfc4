"""The checkers themselves must fail on broken states (a checker that cannot fail is
worse than none): corrupt a healthy core one way at a time."""

from __future__ import annotations

import dataclasses

import pytest

from services.residency.core import (
    AdmitSpec,
    CommandKind,
    PolicyConfig,
    ReclaimOrder,
    RequestReport,
    ResidencyCore,
    WorkerSpec,
)
from services.residency.core import invariants as inv
from services.residency.core.trace import TraceEvent


def healthy() -> ResidencyCore:
    core = ResidencyCore(PolicyConfig(reclaim_order=ReclaimOrder.LARGEST, populate_inflight=0,
                                      trace_limit=1000))
    core.register_worker(WorkerSpec("w0", 100, 10), [RequestReport("A", 5, 30, 30, 0),
                                                     RequestReport("B", 5, 20, 20, 20),
                                                     RequestReport("C", 5, 25, 25, 0)])
    core.admit(AdmitSpec("D", 40))
    inv.check_all(core)
    return core


def test_capacity_checker_fails_on_overcommit() -> None:
    core = healthy()
    core.requests["B"].required += 50
    with pytest.raises(AssertionError, match="M_req"):
        inv.assert_capacity(core)


def test_leak_checker_fails_on_lost_pages() -> None:
    core = healthy()
    core.workers["w0"].allocated -= 3
    with pytest.raises(AssertionError, match="allocated sum"):
        inv.assert_no_page_leak(core)


def test_recoverability_checker_fails_on_unbacked_drop() -> None:
    core = healthy()
    core.requests["C"].ready -= 1
    with pytest.raises(AssertionError, match="C: ready=24 backed=0"):
        inv.assert_recoverable(core)


def test_minimality_checker_fails_on_overshoot_and_wrong_order() -> None:
    core = healthy()
    [d] = core.reclaim_log        # Δ = 40 → A (30) + C (25)
    assert d.chosen == ("A", "C")
    core.reclaim_log[0] = dataclasses.replace(d, chosen=("A", "C", "B"))
    with pytest.raises(AssertionError, match=r"not a prefix|more than"):
        inv.assert_reclaim_minimal(core)
    core.reclaim_log[0] = dataclasses.replace(d, candidates=d.candidates[::-1])
    with pytest.raises(AssertionError, match="order"):
        inv.assert_reclaim_minimal(core)


def test_backup_order_checker_fails_on_early_retire() -> None:
    core = healthy()
    core.trace.append(TraceEvent("issue", "w0", "C", CommandKind.RETIRE, 99, 25, False))
    with pytest.raises(AssertionError, match="before its Backup"):
        inv.assert_backup_before_retire(core)
