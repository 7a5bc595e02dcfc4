"""Property tests: random register / admit / ack / release / expire / crash / rebuild
sequences on both policies and every reclaim order; after every step the capacity
invariant (eq. 3), no leaked page, I1, eq. 4 minimality and backup-before-retire hold."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from services.common.errors import DHiSparseError
from services.residency.core import (
    AdmitSpec,
    PolicyConfig,
    PolicyKind,
    ReclaimOrder,
    RequestReport,
    ResidencyCore,
    TicketState,
    WorkerSpec,
)
from services.residency.core.invariants import check_all
from tests.residency.helpers import FakeClock, fingerprint

WORKERS = ["w0", "w1", "w2"]
REQUESTS = [f"r{i}" for i in range(12)]


class ResidencyMachine(RuleBasedStateMachine):
    @initialize(policy=st.sampled_from(PolicyKind), order=st.sampled_from(ReclaimOrder),
                pages=st.integers(1, 8), inflight=st.integers(0, 3))
    def setup(self, policy, order, pages, inflight) -> None:
        self.clock = FakeClock()
        self.core = ResidencyCore(
            PolicyConfig(policy=policy, reclaim_order=order, populate_pages=pages,
                         populate_inflight=inflight, base_pages=2, trace_limit=100_000),
            self.clock)
        self.tickets = []
        self.delivered = []   # commands taken by "workers", not yet acknowledged
        self.core.register_worker(WorkerSpec("w0", 60, 4, 6))

    def _try(self, call) -> None:
        before = fingerprint(self.core)
        try:
            call()
        except DHiSparseError:
            assert fingerprint(self.core) == before, "state changed by a failed call"

    @rule(wid=st.sampled_from(WORKERS), cap=st.integers(10, 80), res=st.integers(0, 5),
          slots=st.integers(1, 6))
    def register(self, wid, cap, res, slots) -> None:
        self._try(lambda: self.core.register_worker(WorkerSpec(wid, cap, res, slots)))

    @rule(batch=st.lists(st.tuples(st.sampled_from(REQUESTS), st.integers(-1, 20),
                                   st.integers(0, 60), st.sampled_from(["", "", "", *WORKERS]),
                                   st.none() | st.floats(0.1, 5.0)), min_size=1, max_size=4))
    def admit(self, batch) -> None:
        for rid, req, hist, pin, ttl in batch:
            deadline = None if ttl is None else self.clock.now + ttl
            spec = AdmitSpec(rid, req, hist, pin) if req >= 0 else None
            if spec is None:
                with pytest.raises(DHiSparseError):
                    AdmitSpec(rid, req, hist, pin)
                continue
            self._try(lambda s=spec, d=deadline: self.tickets.append(self.core.admit(s, d)))

    @rule()
    def deliver(self) -> None:
        for wid in list(self.core.workers):
            self.delivered += self.core.take_commands(wid)

    @rule(rounds=st.integers(1, 4))
    def workers_complete_everything(self, rounds) -> None:
        for _ in range(rounds):
            self.deliver()
            done, self.delivered = self.delivered, []
            for cmd in done:
                self._try(lambda c=cmd: self.core.ack(c.command_id, c.worker_id))

    @precondition(lambda self: self.delivered)
    @rule(data=st.data(), ok=st.booleans(), twice=st.booleans())
    def ack(self, data, ok, twice) -> None:
        cmd = self.delivered.pop(data.draw(st.integers(0, len(self.delivered) - 1)))
        self._try(lambda: self.core.ack(cmd.command_id, cmd.worker_id, ok or twice))
        if twice:
            self._try(lambda: self.core.ack(cmd.command_id, cmd.worker_id))

    @rule(rid=st.sampled_from(REQUESTS))
    def release(self, rid) -> None:
        self._try(lambda: self.core.release(rid))

    @rule(seconds=st.floats(0.0, 3.0))
    def tick(self, seconds) -> None:
        self.clock.advance(seconds)
        for t in self.core.expire():
            assert t.state is TicketState.EXPIRED and t.deadline <= self.clock.now

    @precondition(lambda self: any(t.state is TicketState.WAITING for t in self.tickets))
    @rule(data=st.data())
    def cancel(self, data) -> None:
        waiting = [t for t in self.tickets if t.state is TicketState.WAITING]
        t = data.draw(st.sampled_from(waiting))
        assert self.core.cancel(t) and t.state is TicketState.CANCELLED

    @rule(wid=st.sampled_from(WORKERS))
    def crash(self, wid) -> None:
        self._try(lambda: self.core.remove_worker(wid))

    @rule(wid=st.sampled_from(WORKERS))
    def controller_restart_rebuilds(self, wid) -> None:
        """A fresh core learns the worker's requests from its report (ready pages only;
        in-flight commands are lost with the old controller)."""
        w = self.core.workers.get(wid)
        if w is None:
            return
        reports = [RequestReport(e.request_id, e.required, e.history, e.ready, e.backed)
                   for e in w.requests.values()]
        spec = w.spec
        self.core.remove_worker(wid)
        self.delivered = [c for c in self.delivered if c.worker_id != wid]
        assert self.core.register_worker(spec, reports) == len(reports)

    def teardown(self) -> None:
        if hasattr(self, "core"):
            core = self.core
            kinds = {(e.kind, e.command.value if e.command else "") for e in core.trace}
            for kind in (("issue", "retire"), ("ack", "populate"), ("drop", ""), ("adopt", "")):
                event(f"{kind}: {kind in kinds}")
            event(f"eq. 4 reclaims: {bool(core.reclaim_log)}")

    @invariant()
    def invariants_hold(self) -> None:
        if hasattr(self, "core"):
            check_all(self.core)
            latest = {t.spec.request_id: t for t in self.tickets}
            for t in latest.values():
                if t.state is TicketState.GRANTED:
                    e = self.core.requests.get(t.spec.request_id)
                    assert e is None or e.required == t.spec.required_pages


ResidencyMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_residency_machine = ResidencyMachine.TestCase


@pytest.mark.parametrize("policy", list(PolicyKind))
def test_drained_cluster_returns_every_page(policy) -> None:
    """Admit to saturation, ack everything, release everything: all pages free again."""
    core = ResidencyCore(PolicyConfig(policy=policy, populate_pages=3, trace_limit=10_000))
    core.register_worker(WorkerSpec("w0", 50, 5))
    core.register_worker(WorkerSpec("w1", 40, 0))
    for i in range(30):
        core.admit(AdmitSpec(f"r{i}", 3 + i % 7, 5 + 3 * i))
        for wid in core.workers:
            for c in core.take_commands(wid):
                core.ack(c.command_id)
        check_all(core)
    while core.requests:
        core.release(next(iter(core.requests)))
        for wid in core.workers:
            for c in core.take_commands(wid):
                core.ack(c.command_id)
        check_all(core)
    assert all(w.free_pages == w.spec.admittable_pages for w in core.workers.values())
    assert not core.commands and not core.requests and not core.waiting


@pytest.mark.parametrize("policy", list(PolicyKind))
@pytest.mark.parametrize("order", list(ReclaimOrder))
def test_random_walks_under_pressure(policy, order) -> None:
    """Seeded high-pressure walks (hypothesis spreads its steps over every rule; these
    concentrate on admit / complete / release so reclaims and populates dominate)."""
    import random
    reclaims = populates = 0
    for seed in range(40):
        rnd = random.Random(seed)
        core = ResidencyCore(PolicyConfig(policy=policy, reclaim_order=order, base_pages=3,
                                          populate_pages=rnd.randint(1, 8),
                                          trace_limit=100_000))
        for wid in ("w0", "w1"):
            core.register_worker(WorkerSpec(wid, rnd.randint(30, 90), rnd.randint(0, 6), 6))
        for _ in range(60):
            op = rnd.choice(["admit", "admit", "work", "work", "release", "partial"])
            before = fingerprint(core)
            try:
                if op == "admit":
                    core.admit(AdmitSpec(f"r{rnd.randrange(16)}", rnd.randint(0, 25),
                                         rnd.randint(0, 70)))
                elif op == "release":
                    core.release(f"r{rnd.randrange(16)}")
                else:
                    for wid in core.workers:
                        cmds = core.take_commands(wid)
                        for c in cmds[: (len(cmds) if op == "work" else 1)]:
                            core.ack(c.command_id, wid, ok=rnd.random() > 0.05)
            except DHiSparseError:
                assert fingerprint(core) == before
            check_all(core)
        kinds = {(e.kind, e.command.value if e.command else "") for e in core.trace}
        reclaims += ("issue", "retire") in kinds
        populates += ("ack", "populate") in kinds
    assert reclaims >= 20 and populates >= 10, (reclaims, populates)
