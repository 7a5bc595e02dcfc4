"""The residency policy core: admission, reclaim (Backup → Retire), repopulation.

Plain Python, no I/O, not thread-safe: callers serialise (the asyncio controller runs it
on one loop; an in-process engine calls it from its scheduler thread). Every public
method validates first and changes nothing when it raises. Typical in-process use::

    core = ResidencyCore(PolicyConfig())
    core.register_worker(WorkerSpec("w0", capacity_pages=4096, reserve_pages=64))
    ticket = core.admit(AdmitSpec("r1", required_pages=40, history_pages=900))
    for cmd in core.take_commands("w0"):      # deliver Backup/Retire/Populate …
        ...; core.ack(cmd.command_id)          # … and acknowledge when done
    if ticket.state is TicketState.GRANTED: ticket.grant.optional_pages
    core.release("r1")
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping

from services.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from services.residency.core.ledger import RequestEntry, WorkerLedger
from services.residency.core.model import (
    AdmitSpec,
    Command,
    CommandKind,
    Grant,
    PolicyConfig,
    PolicyKind,
    RequestReport,
    Ticket,
    TicketState,
    WorkerSpec,
)
from services.residency.core.policy import (
    elastic_alpha,
    elastic_target,
    place,
    reclaim_candidates,
    select_eq4,
)
from services.residency.core.trace import Candidate, ReclaimDecision, TraceEvent

FINISHED_COMMANDS_KEPT = 65536   # acked/cancelled ids remembered to answer duplicate acks


class ResidencyCore:
    """Ledgers of all workers, the FIFO of waiting admissions and in-flight commands.

    ``on_resolved(ticket)`` is called when a waiting ticket is granted or expires (it
    must not call back into the core). Commands queue per worker until
    :meth:`take_commands`; ``command_id_base`` lets a restarted controller issue ids
    that cannot collide with a previous incarnation's.
    """

    def __init__(self, config: PolicyConfig | None = None,
                 clock: Callable[[], float] = time.monotonic, command_id_base: int = 1,
                 on_resolved: Callable[[Ticket], None] | None = None) -> None:
        self.config = config or PolicyConfig()
        self._clock = clock
        self._on_resolved = on_resolved
        self._workers: dict[str, WorkerLedger] = {}
        self._requests: dict[str, RequestEntry] = {}
        self._commands: dict[int, Command] = {}
        self._finished: OrderedDict[int, bool] = OrderedDict()   # id -> acked
        self._outbox: dict[str, list[Command]] = {}
        self._queue: deque[Ticket] = deque()
        self._waiting: dict[str, Ticket] = {}
        self._next_command = command_id_base
        self._next_ticket = 1
        self._next_seq = 0
        self._waiting_before = False   # admissions were waiting after the last schedule
        limit = self.config.trace_limit or None
        self.trace: deque[TraceEvent] = deque(maxlen=limit if limit else 0)
        self.reclaim_log: deque[ReclaimDecision] = deque(maxlen=limit if limit else 0)

    # -- read-only views (do not mutate) ---------------------------------------------
    @property
    def workers(self) -> Mapping[str, WorkerLedger]:
        return self._workers

    @property
    def requests(self) -> Mapping[str, RequestEntry]:
        return self._requests

    @property
    def commands(self) -> Mapping[int, Command]:
        """Commands issued and not yet acknowledged."""
        return self._commands

    @property
    def waiting(self) -> tuple[Ticket, ...]:
        return tuple(self._queue)

    def worker(self, worker_id: str) -> WorkerLedger:
        if worker_id not in self._workers:
            raise NotFound(f"worker_id={worker_id!r} is not registered")
        return self._workers[worker_id]

    def request(self, request_id: str) -> RequestEntry:
        if request_id not in self._requests:
            raise NotFound(f"request_id={request_id!r} is not admitted")
        return self._requests[request_id]

    # -- workers -----------------------------------------------------------------------
    def register_worker(self, spec: WorkerSpec, reports: Iterable[RequestReport] = ()) -> int:
        """Register ``spec`` (idempotent for an identical pool) and adopt the reported
        requests the ledger does not know yet (soft-state rebuild after a restart).
        Returns how many requests were adopted."""
        old = self._workers.get(spec.worker_id)
        if old is not None and _pool(old.spec) != _pool(spec):
            raise AlreadyExists(
                f"worker {spec.worker_id} is registered with (capacity_pages, reserve_pages,"
                f" request_slots)={_pool(old.spec)}; got {_pool(spec)}")
        new = self._new_reports(spec, old, list(reports))
        w = old or WorkerLedger(spec, self._clock())
        w.spec, w.last_seen = spec, self._clock()
        self._workers[spec.worker_id] = w
        for r in new:
            e = RequestEntry(r.request_id, spec.worker_id, r.required_pages, r.history_pages,
                             r.optional_pages, r.optional_pages, r.backed_pages, self._seq())
            self._add(w, e, "adopt")
        self._fail_unservable()
        self._schedule()
        return len(new)

    def _new_reports(self, spec: WorkerSpec, old: WorkerLedger | None,
                     reports: list[RequestReport]) -> list[RequestReport]:
        new, seen = [], set()
        for r in reports:
            if r.request_id in seen:
                raise InvalidArgument(f"request_id={r.request_id!r} reported twice")
            seen.add(r.request_id)
            owner = self._requests.get(r.request_id)
            if owner is not None and owner.worker_id != spec.worker_id:
                raise AlreadyExists(f"request {r.request_id} is admitted on worker "
                                    f"{owner.worker_id}, reported by {spec.worker_id}")
            if r.request_id in self._waiting:
                raise AlreadyExists(f"request {r.request_id} is waiting for admission")
            if owner is None:
                new.append(r)
        held = (old.required + old.allocated) if old else 0
        pages = held + sum(r.required_pages + r.optional_pages for r in new)
        if pages > spec.admittable_pages:
            raise InvalidArgument(
                f"worker {spec.worker_id}: reported pages {pages} exceed capacity_pages − "
                f"reserve_pages = {spec.admittable_pages}")
        slots = (len(old.requests) if old else 0) + len(new)
        if slots > spec.request_slots:
            raise InvalidArgument(f"worker {spec.worker_id}: {slots} requests exceed "
                                  f"request_slots={spec.request_slots}")
        return new

    def remove_worker(self, worker_id: str) -> list[str]:
        """Drop a dead worker and everything it held; returns the dropped request ids."""
        w = self.worker(worker_id)
        dropped = list(w.requests)
        for rid in dropped:
            self._forget(w, rid, "drop")
        del self._workers[worker_id]
        self._outbox.pop(worker_id, None)
        self._fail_unservable()
        self._schedule()
        return dropped

    def _fail_unservable(self) -> None:
        """Fail the waiting admissions no registered worker can ever serve, so none blocks
        the FIFO queue for good: one pinned to a worker that is gone, or one that needs more
        pages than the largest admittable pool (queued before any worker registered)."""
        largest = max((w.spec.admittable_pages for w in self._workers.values()), default=None)
        for t in list(self._queue):
            spec, failure = t.spec, None
            if spec.worker_id and spec.worker_id not in self._workers:
                failure = Unavailable(f"request_id={spec.request_id!r}: pinned worker "
                                      f"{spec.worker_id} is gone")
            elif not spec.worker_id and largest is not None and spec.required_pages > largest:
                failure = InvalidArgument(
                    f"required_pages={spec.required_pages} exceeds the largest admittable pool "
                    f"(capacity − reserve) of {largest} pages")
            if failure is not None:
                self._dequeue(t, TicketState.FAILED)
                t.failure = failure
                if self._on_resolved:
                    self._on_resolved(t)

    def touch(self, worker_id: str) -> None:
        """A heartbeat or any report from the worker."""
        self.worker(worker_id).last_seen = self._clock()

    def stale_workers(self, timeout_s: float) -> list[str]:
        now = self._clock()
        return [wid for wid, w in self._workers.items() if now - w.last_seen > timeout_s]

    # -- admissions ----------------------------------------------------------------------
    def admit(self, spec: AdmitSpec, deadline: float | None = None) -> Ticket:
        """Queue an admission (FIFO) and serve what can be served. The returned ticket is
        GRANTED at once when pages are free; otherwise WAITING until reclaimed pages land,
        :meth:`expire` passes ``deadline`` (clock time) or :meth:`cancel`."""
        self._check_admissible(spec)
        ticket = Ticket(self._next_ticket, spec, self._clock(), deadline)
        self._next_ticket += 1
        self._queue.append(ticket)
        self._waiting[spec.request_id] = ticket
        self._schedule(touched="")   # only a worker that grants it changes
        return ticket

    def _check_admissible(self, spec: AdmitSpec) -> None:
        if spec.request_id in self._requests or spec.request_id in self._waiting:
            raise AlreadyExists(f"request_id={spec.request_id!r} is already admitted or waiting")
        if spec.worker_id:
            limit = self.worker(spec.worker_id).spec.admittable_pages
        elif self._workers:
            limit = max(w.spec.admittable_pages for w in self._workers.values())
        else:
            return   # no worker yet: wait for one to register
        if spec.required_pages > limit:
            raise InvalidArgument(f"required_pages={spec.required_pages} exceeds the largest "
                                  f"admittable pool (capacity − reserve) of {limit} pages")

    def cancel(self, ticket: Ticket) -> bool:
        """Withdraw a waiting admission; False when it is no longer waiting."""
        if ticket.state is not TicketState.WAITING:
            return False
        self._dequeue(ticket, TicketState.CANCELLED)
        self._schedule()
        return True

    def expire(self) -> list[Ticket]:
        """Expire waiting admissions whose deadline passed (each goes to on_resolved)."""
        now = self._clock()
        late = [t for t in self._queue if t.deadline is not None and t.deadline <= now]
        for t in late:
            self._dequeue(t, TicketState.EXPIRED)
            if self._on_resolved:
                self._on_resolved(t)
        if late:
            self._schedule()
        return late

    def _dequeue(self, ticket: Ticket, state: TicketState) -> None:
        self._queue.remove(ticket)
        del self._waiting[ticket.spec.request_id]
        ticket.state, ticket.pledged_worker = state, None

    def release(self, request_id: str) -> int:
        """The request finished: free its required and optional pages and its slot."""
        e = self.request(request_id)
        w = self._workers[e.worker_id]
        self._forget(w, request_id, "release")
        self._schedule(w.worker_id)
        return e.required + e.allocated

    # -- commands ------------------------------------------------------------------------
    def take_commands(self, worker_id: str) -> list[Command]:
        """Commands issued to ``worker_id`` since the last call (cancelled ones dropped)."""
        cmds = self._outbox.pop(worker_id, [])
        return [c for c in cmds if c.command_id in self._commands]

    def pending_commands(self, worker_id: str) -> list[Command]:
        """Every unacknowledged command of a worker (re-sent when its session reconnects)."""
        return [c for c in self._commands.values() if c.worker_id == worker_id]

    def ack(self, command_id: int, worker_id: str = "", ok: bool = True) -> Command | None:
        """The worker completed (``ok``) or gave up on a command. Returns the command, or
        None for a command cancelled meanwhile (its request was released)."""
        cmd = self._commands.get(command_id)
        if cmd is None:
            if command_id not in self._finished:
                raise NotFound(f"command_id={command_id} is unknown to this controller")
            if self._finished[command_id]:
                raise FailedPrecondition(f"command_id={command_id} was acknowledged already")
            self._finished[command_id] = True
            return None
        if worker_id and cmd.worker_id != worker_id:
            raise FailedPrecondition(f"command_id={command_id} was sent to worker "
                                     f"{cmd.worker_id}, not {worker_id}")
        self._finish(cmd, acked=True)
        w, e = self._workers[cmd.worker_id], self._requests[cmd.request_id]
        self._record("ack", e, cmd, ok=ok)
        if cmd.kind is CommandKind.POPULATE:
            w.populating -= 1
            (w.publish if ok else w.unreserve)(e, cmd.pages)
        elif cmd.kind is CommandKind.BACKUP and ok:
            e.backed = e.history
            self._advance_reclaim(e)
        elif cmd.kind is CommandKind.RETIRE and ok:
            w.retire(e, cmd.pages)
            e.retire_pages = 0
        else:
            e.retire_pages = 0   # a failed Backup/Retire aborts that reclaim
        self._schedule(w.worker_id)
        return cmd

    # -- internals -----------------------------------------------------------------------
    def _seq(self) -> int:
        self._next_seq += 1
        return self._next_seq

    def _add(self, w: WorkerLedger, e: RequestEntry, kind: str) -> None:
        w.add(e)
        self._requests[e.request_id] = e
        self._record(kind, e)

    def _forget(self, w: WorkerLedger, request_id: str, kind: str) -> None:
        e = self._requests[request_id]
        if e.pending is not None:
            cmd = self._commands[e.pending]
            if cmd.kind is CommandKind.POPULATE:
                w.populating -= 1
            self._finish(cmd, acked=False)
        w.remove(request_id)
        del self._requests[request_id]
        self._record(kind, e)

    def _finish(self, cmd: Command, acked: bool) -> None:
        del self._commands[cmd.command_id]
        self._requests[cmd.request_id].pending = None
        self._finished[cmd.command_id] = acked
        while len(self._finished) > FINISHED_COMMANDS_KEPT:
            self._finished.popitem(last=False)

    def _issue(self, kind: CommandKind, e: RequestEntry, pages: int) -> None:
        cmd = Command(self._next_command, kind, e.worker_id, e.request_id, pages)
        self._next_command += 1
        self._commands[cmd.command_id] = cmd
        self._outbox.setdefault(e.worker_id, []).append(cmd)
        e.pending = cmd.command_id
        self._record("issue", e, cmd)

    def _record(self, kind: str, e: RequestEntry, cmd: Command | None = None,
                ok: bool = True) -> None:
        if self.trace.maxlen:
            self.trace.append(TraceEvent(kind, e.worker_id, e.request_id,
                                         cmd.kind if cmd else None,
                                         cmd.command_id if cmd else 0,
                                         cmd.pages if cmd else 0, e.fully_backed, ok))

    def _schedule(self, touched: str | None = None) -> None:
        """Serve the FIFO head(s), trim (elastic), then repopulate when nothing waits.

        Populate only needs to look at the worker whose ledger the event changed
        (``touched``; ``""``: none — a grant never leaves a worker with both free pages
        and unpopulated history, it keeps ``min(history, free − required)``) — unless
        admissions were waiting before this event (populate was held back everywhere) or
        the caller does not say (``None``: every worker)."""
        held_back = self._waiting_before
        while self._queue and self._try_serve(self._queue[0]):
            pass
        if self.config.policy is PolicyKind.ELASTIC:
            for w in self._workers.values():
                self._trim(w, w.required)
        self._waiting_before = bool(self._queue)
        if self._queue:
            return
        if held_back or touched is None:
            targets = list(self._workers.values())
        else:
            targets = [self._workers[touched]] if touched in self._workers else []
        for w in targets:
            self._populate(w)

    def _try_serve(self, t: Ticket) -> bool:
        spec = t.spec
        w = self._workers.get(t.pledged_worker or "")
        if w is not None and w.free_slots > 0:
            if spec.required_pages <= w.free_pages:
                self._grant(t, w)
                return True
            if w.incoming_pages > 0:
                return False   # reclaim in flight: wait for its Retire acks
        t.pledged_worker = None
        p = place(self._workers.values(), spec.required_pages, spec.worker_id,
                  lambda w: self._reclaimable(w, spec.required_pages))
        if p is None:
            return False
        if p.fits_now:
            self._grant(t, p.worker)
            return True
        if p.deficit > 0:
            t.reclaimed += self._reclaim(p.worker, p.deficit, spec.required_pages)
        t.pledged_worker = p.worker.worker_id
        return False

    def _grant(self, t: Ticket, w: WorkerLedger) -> None:
        spec, now = t.spec, self._clock()
        keep = 0 if len(self._queue) > 1 else w.free_pages - spec.required_pages
        keep = min(spec.history_pages, keep)
        if self.config.policy is PolicyKind.ELASTIC:
            keep = min(keep, self._target(w, spec.history_pages, spec.required_pages))
        e = RequestEntry(spec.request_id, w.worker_id, spec.required_pages,
                         spec.history_pages, keep, keep, spec.history_pages - keep, self._seq())
        self._queue.popleft()
        del self._waiting[spec.request_id]
        self._add(w, e, "admit")
        t.state, t.pledged_worker = TicketState.GRANTED, None
        t.grant = Grant(spec.request_id, w.worker_id, w.spec.address, spec.required_pages,
                        keep, now - t.enqueued_at, t.reclaimed)
        if self._on_resolved:
            self._on_resolved(t)

    def _target(self, w: WorkerLedger, history: int, extra_required: int = 0) -> int:
        alpha = elastic_alpha(w.required + extra_required, w.spec.capacity_pages,
                              w.spec.reserve_pages, self.config.alpha_min)
        return elastic_target(history, self.config.base_pages, alpha)

    def _reclaimable(self, w: WorkerLedger, required: int) -> int:
        cands = reclaim_candidates(w, self.config.reclaim_order)
        if self.config.policy is PolicyKind.WHOLE_REQUEST:
            return sum(e.allocated for e in cands)
        return sum(max(0, e.allocated - self._target(w, e.history, required)) for e in cands)

    def _reclaim(self, w: WorkerLedger, deficit: int, required: int) -> tuple[str, ...]:
        if self.config.policy is PolicyKind.ELASTIC:
            return self._trim(w, w.required + required)
        cands = reclaim_candidates(w, self.config.reclaim_order)
        q = select_eq4([e.allocated for e in cands], deficit)
        assert q is not None, "placement guarantees the candidates cover the deficit"
        chosen = cands[:q]
        if self.reclaim_log.maxlen:
            self.reclaim_log.append(ReclaimDecision(
                w.worker_id, deficit, self.config.reclaim_order,
                tuple(Candidate(e.request_id, e.allocated, e.fully_backed, e.seq) for e in cands),
                tuple(e.request_id for e in chosen)))
        for e in chosen:
            e.retire_pages = e.allocated
            self._advance_reclaim(e)
        return tuple(e.request_id for e in chosen)

    def _trim(self, w: WorkerLedger, required: int) -> tuple[str, ...]:
        """Elastic form: trim every idle request above its target for ``required``."""
        trimmed = []
        for e in reclaim_candidates(w, self.config.reclaim_order):
            excess = e.allocated - self._target(w, e.history, required - w.required)
            if excess > 0:
                e.retire_pages = excess
                self._advance_reclaim(e)
                trimmed.append(e.request_id)
        return tuple(trimmed)

    def _advance_reclaim(self, e: RequestEntry) -> None:
        """Backup first (I4: retire only pages whose rows have a host copy), then Retire."""
        if e.retire_pages <= 0:
            return
        if not e.fully_backed:
            self._issue(CommandKind.BACKUP, e, e.history - e.backed)
        else:
            self._issue(CommandKind.RETIRE, e, e.retire_pages)

    def _populate(self, w: WorkerLedger) -> None:
        """Bounded round robin: at most ``populate_inflight`` Populates per worker, each of
        at most ``populate_pages`` pages, visiting requests in admission order after the
        one populated last."""
        cfg = self.config
        while w.populating < cfg.populate_inflight and w.free_pages > 0:
            e = self._next_to_populate(w)
            if e is None:
                return
            cap = self._target(w, e.history) if cfg.policy is PolicyKind.ELASTIC else e.history
            pages = min(cfg.populate_pages, cap - e.allocated, w.free_pages)
            w.reserve_optional(e, pages)
            w.populating += 1
            w.populate_cursor = e.seq
            self._issue(CommandKind.POPULATE, e, pages)

    def _next_to_populate(self, w: WorkerLedger) -> RequestEntry | None:
        elastic = self.config.policy is PolicyKind.ELASTIC
        first = None
        for e in w.requests.values():
            cap = self._target(w, e.history) if elastic else e.history
            if e.busy or e.allocated >= cap:
                continue
            if e.seq > w.populate_cursor:
                return e
            first = first or e
        return first


def _pool(spec: WorkerSpec) -> tuple[int, int, int]:
    return (spec.capacity_pages, spec.reserve_pages, spec.request_slots)
