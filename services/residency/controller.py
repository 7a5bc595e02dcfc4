"""The async shell around :class:`ResidencyCore`: waiting admissions as futures, one
command queue per worker session, heartbeat reaping, metrics. No gRPC here either: the
servicer converts protobuf to these calls. Everything runs on one event loop, which
serialises access to the core.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterable

from services.common.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from services.common.logging import get_logger
from services.residency.config import ResidencyConfig
from services.residency.core import (
    AdmitSpec,
    Command,
    CommandKind,
    Grant,
    RequestReport,
    ResidencyCore,
    Ticket,
    TicketState,
    WorkerSpec,
)
from services.residency.metrics import ResidencyMetrics

log = get_logger("residency")

_CLOSED = object()


class WorkerSession:
    """The down-stream of one worker's Session: commands, then _CLOSED or an error."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.queue: asyncio.Queue[object] = asyncio.Queue()

    def send(self, cmd: Command) -> None:
        self.queue.put_nowait(cmd)

    def close(self, error: BaseException | None = None) -> None:
        self.queue.put_nowait(error if error is not None else _CLOSED)

    async def next(self) -> Command | None:
        """The next command; None when the session ended; raises a reported error."""
        item = await self.queue.get()
        if item is _CLOSED:
            return None
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, Command)
        return item


class ResidencyController:
    def __init__(self, config: ResidencyConfig, metrics: ResidencyMetrics | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.metrics = metrics or ResidencyMetrics()
        self.core_clock = clock
        self.epoch = random.SystemRandom().randrange(1, 1 << 31)
        self.core = ResidencyCore(config.policy_config(), clock, command_id_base=self.epoch << 32,
                                  on_resolved=self._resolved)
        self._waiters: dict[int, asyncio.Future[Ticket]] = {}
        self._sessions: dict[str, WorkerSession] = {}
        self._ticker: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        self._ticker = asyncio.create_task(self._tick_forever())

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        for s in self._sessions.values():
            s.close(Unavailable("the residency controller is shutting down"))
        self._sessions.clear()

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.tick_seconds)
            try:
                self.tick()
            except Exception:   # never let one bad tick stop reaping
                log.exception("residency tick failed")

    def tick(self) -> None:
        """Drop workers silent for longer than the heartbeat timeout; publish gauges."""
        for wid in self.core.stale_workers(self.config.heartbeat_timeout_seconds):
            dropped = self.core.remove_worker(wid)
            log.warning("worker %s missed its heartbeats: dropped with %d requests",
                        wid, len(dropped))
            session = self._sessions.pop(wid, None)
            if session is not None:
                session.close(Unavailable(f"worker {wid} dropped after "
                                          f"{self.config.heartbeat_timeout_seconds}s silence"))
        self._flush()
        self.metrics.refresh(self.core)

    # -- calls ---------------------------------------------------------------------------
    def register(self, spec: WorkerSpec, reports: Iterable[RequestReport] = ()) -> int:
        adopted = self.core.register_worker(spec, reports)
        if adopted:
            log.info("worker %s registered, adopted %d requests", spec.worker_id, adopted)
        self._flush()
        return adopted

    async def admit(self, spec: AdmitSpec, timeout: float | None) -> Grant:
        """Grant or wait (FIFO) up to ``timeout`` seconds; cancelling the caller withdraws
        the admission. On timeout nothing is held: DeadlineExceeded."""
        ticket = self.core.admit(spec)
        self._flush()
        if ticket.state is not TicketState.GRANTED:
            fut = asyncio.get_running_loop().create_future()
            self._waiters[ticket.ticket_id] = fut
            try:
                await asyncio.wait_for(asyncio.shield(fut), timeout)
            except (TimeoutError, asyncio.CancelledError) as exc:
                self._withdraw(ticket)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                raise DeadlineExceeded(
                    f"request {spec.request_id}: no {spec.required_pages} pages within the "
                    f"deadline of {timeout:.3f}s ({len(self.core.waiting)} admissions still "
                    "waiting)") from None
            finally:
                self._waiters.pop(ticket.ticket_id, None)
        if ticket.state is TicketState.FAILED:  # no worker can ever serve it
            assert ticket.failure is not None
            raise ticket.failure
        assert ticket.grant is not None
        self.metrics.admission_wait.labels(ticket.grant.worker_id).observe(ticket.grant.waited_s)
        return ticket.grant

    def _withdraw(self, ticket: Ticket) -> None:
        if not self.core.cancel(ticket) and ticket.state is TicketState.GRANTED:
            self.core.release(ticket.spec.request_id)   # granted at the last instant
        self._flush()

    def release(self, request_id: str, worker_id: str = "") -> int:
        if not request_id:
            raise InvalidArgument("request_id is empty; expected the id the Admit was given")
        entry = self.core.request(request_id)
        if worker_id and entry.worker_id != worker_id:
            raise FailedPrecondition(f"request {request_id} is on worker {entry.worker_id}, "
                                     f"not {worker_id}")
        freed = self.core.release(request_id)
        self._flush()
        return freed

    # -- sessions --------------------------------------------------------------------------
    def open_session(self, spec: WorkerSpec, reports: Iterable[RequestReport]) -> WorkerSession:
        """Register from the hello, replace an older session, re-send unacked commands."""
        self.register(spec, reports)
        old = self._sessions.pop(spec.worker_id, None)
        if old is not None:
            old.close(FailedPrecondition(f"worker {spec.worker_id}: replaced by a newer session"))
        session = WorkerSession(spec.worker_id)
        self._sessions[spec.worker_id] = session
        self.core.take_commands(spec.worker_id)          # all of them are re-sent below
        for cmd in sorted(self.core.pending_commands(spec.worker_id),
                          key=lambda c: c.command_id):
            session.send(cmd)
        return session

    def report(self, session: WorkerSession, acks: Iterable[tuple[int, bool]],
               released: Iterable[str] = ()) -> None:
        """Acks (command id, ok), heartbeats (any report) and finished requests. Every item
        is handled; a refused one (an ack given twice, another worker's command or
        request) is raised after the rest, so one bad item neither drops the others nor
        keeps a finished request held. An ack of a command this controller never issued (an
        earlier incarnation's: the worker cannot tell) is logged and skipped."""
        wid = session.worker_id
        current = self._sessions.get(wid) is session
        refused: FailedPrecondition | None = None
        try:
            # a replaced session's stream, read before its task was cancelled: its acks are
            # for commands re-sent to the newer session (applying them here would make the
            # new session's acks "twice" and close it); its finished requests still go
            if current:
                self.core.touch(wid)
                for command_id, ok in acks:
                    try:
                        cmd = self.core.ack(command_id, wid, ok)
                    except NotFound:
                        log.info("worker %s acked command %d unknown here", wid, command_id)
                        continue
                    except FailedPrecondition as exc:  # twice, or another worker's: refused
                        refused = refused or exc     # after the rest
                        continue
                    if cmd is not None and ok:
                        self._count(cmd)
            for rid in released:
                try:
                    self.release(rid, wid)
                except NotFound:  # released already (the Release RPC got there first)
                    log.info("worker %s reported %r finished: released already", wid, rid)
                except FailedPrecondition as exc:  # not this worker's: refused after the rest,
                    refused = refused or exc        # so no other finished request stays held
            if refused is not None and current:
                raise refused
        finally:
            self._flush()

    def close_session(self, session: WorkerSession) -> None:
        if self._sessions.get(session.worker_id) is session:
            del self._sessions[session.worker_id]

    def alive(self, worker_id: str) -> bool:
        return worker_id in self._sessions

    # -- internals -----------------------------------------------------------------------
    def _count(self, cmd: Command) -> None:
        if cmd.kind is CommandKind.RETIRE:
            self.metrics.reclaimed.labels(cmd.worker_id).inc(cmd.pages)
        elif cmd.kind is CommandKind.POPULATE:
            self.metrics.populated.labels(cmd.worker_id).inc(cmd.pages)

    def _resolved(self, ticket: Ticket) -> None:
        fut = self._waiters.get(ticket.ticket_id)
        if fut is not None and not fut.done():
            fut.set_result(ticket)

    def _flush(self) -> None:
        """Hand newly issued commands to connected sessions."""
        for wid, session in self._sessions.items():
            for cmd in self.core.take_commands(wid):
                session.send(cmd)
