"""Admission through the residency controller over gRPC (LocalAdmission's interface).

The engine calls ``admit`` / ``granted`` / ``take_commands`` / ``ack`` / ``release`` on its
own thread and never blocks on the network::

    admit(rid, ...)   → a RemoteTicket at once; Admit runs in the background (wait_for_ready,
                        honouring the admission deadline) and resolves it: GRANTED with the
                        grant, or failed with ``ticket.error`` (RESOURCE_EXHAUSTED,
                        DEADLINE_EXCEEDED, ...), which the worker turns into the request's status
    Session thread    RegisterWorker (with the live requests: a restarted controller rebuilds
                        from them), releases requests the controller holds that this process
                        does not know (a previous incarnation's), then the Session stream:
                        hello, acks and heartbeats up; commands down into a queue that
                        ``take_commands`` drains. A broken stream reconnects with backoff;
                        running requests keep decoding meanwhile.
    Release thread    Release RPCs, retried while the controller is down.

Commands are idempotent here: a command re-sent after a reconnect whose ack was lost is
acknowledged again without executing it twice, one re-sent while the engine holds it is not
handed out again, and a replaced controller's commands are not run (``current``).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc

from services.common import errors
from services.common.gen.dhisparse.v1 import residency_pb2 as pb
from services.common.gen.dhisparse.v1 import residency_pb2_grpc
from services.common.interceptors import token_metadata
from services.common.logging import get_logger
from services.kvstore.rpc import domain_error
from services.residency.core import Command, CommandKind, Grant, TicketState

log = get_logger("decode.admission")

CHANNEL_OPTIONS = (
    # A restarted controller should be found within ~0.5 s, not after grpc's long backoff.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
)
RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND)
DONE_KEPT = 65536   # acked command ids remembered to re-ack re-sent commands (as the controller)


@dataclass(slots=True, eq=False)
class RemoteTicket:
    """One admission in flight; ``state``/``grant`` are set by the RPC thread."""

    request_id: str
    required_pages: int
    history_pages: int
    deadline: float
    state: TicketState = TicketState.WAITING
    grant: Grant | None = None
    error: errors.DHiSparseError | None = None
    call: grpc.Future | None = None
    withdrawn: bool = False
    released: bool = False   # a Release for it is queued (at most one per ticket)
    retries: int = 0
    last_code: str = ""   # of the last failed attempt (logged when it changes)


@dataclass(frozen=True, slots=True)
class WorkerPool:
    """What the worker registers: its pool and where it serves."""

    worker_id: str
    address: str
    capacity_pages: int
    reserve_pages: int
    request_slots: int
    page_rows: int
    page_bytes: int


LiveReports = Callable[[dict[str, RemoteTicket]], list[pb.RequestPages]]


class RemoteAdmission:
    def __init__(self, target: str, pool: WorkerPool, live_reports: LiveReports,
                 admit_timeout_s: float = 120.0, token: str | None = None,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        self.pool, self.worker_id = pool, pool.worker_id
        self.admit_timeout_s = admit_timeout_s
        self._live_reports = live_reports
        self._metadata = token_metadata(token)
        self._channel = (grpc.secure_channel(target, credentials, CHANNEL_OPTIONS)
                         if credentials is not None
                         else grpc.insecure_channel(target, CHANNEL_OPTIONS))
        self._stub = residency_pb2_grpc.ResidencyStub(self._channel)
        self._lock = threading.Lock()
        self._pending: dict[str, RemoteTicket] = {}    # Admit in flight
        self._live: dict[str, RemoteTicket] = {}       # granted, not released
        self._commands: deque[Command] = deque()
        self._taken: set[int] = set()                  # handed to the engine this epoch
        self._done: OrderedDict[int, bool] = OrderedDict()  # acknowledged ids, DONE_KEPT last
        self._out: queue.Queue[pb.WorkerReport | None] | None = None
        self._releases: queue.Queue[str | None] = queue.Queue()
        self._stop = threading.Event()
        self.epoch = 0
        self.connected = threading.Event()
        self.sessions = 0
        self._session_call: grpc.Future | None = None
        self._threads = [threading.Thread(target=self._session_forever, daemon=True,
                                          name="residency-session"),
                         threading.Thread(target=self._release_forever, daemon=True,
                                          name="residency-release")]
        for t in self._threads:
            t.start()

    # -- LocalAdmission's interface (engine thread) ----------------------------------------
    def admit(self, request_id: str, required_pages: int, history_pages: int) -> RemoteTicket:
        ticket = RemoteTicket(request_id, required_pages, history_pages,
                              time.monotonic() + self.admit_timeout_s)
        with self._lock:
            self._pending[request_id] = ticket
        self._call_admit(ticket)
        return ticket

    @staticmethod
    def granted(ticket: RemoteTicket) -> bool:
        return ticket.state is TicketState.GRANTED

    def take_commands(self) -> list[Command]:
        out = []
        with self._lock:
            while self._commands:
                cmd = self._commands.popleft()
                if cmd.command_id in self._done:      # re-sent after a lost ack
                    self._send_ack(cmd.command_id, self._done[cmd.command_id])
                elif cmd.command_id in self._taken:   # re-sent while the engine holds it
                    continue
                elif cmd.request_id not in self._live:
                    self._send_ack(cmd.command_id, False, "unknown request")
                else:
                    self._taken.add(cmd.command_id)
                    out.append(cmd)
        return out

    def current(self, command: Command) -> bool:
        """Whether ``command`` came from the controller of this session's epoch: one taken
        before a new controller took over is not run (its ledger was rebuilt from a report
        made without it) nor acknowledged."""
        with self._lock:
            return command.command_id in self._taken

    def ack(self, command: Command, ok: bool = True) -> None:
        with self._lock:
            self._taken.discard(command.command_id)
            self._done[command.command_id] = ok
            while len(self._done) > DONE_KEPT:
                self._done.popitem(last=False)
            self._send_ack(command.command_id, ok)

    def release(self, request_id: str) -> None:
        with self._lock:
            self._live.pop(request_id, None)
        self._releases.put(request_id)

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._pending)

    # -- beyond LocalAdmission ------------------------------------------------------------
    def cancel(self, ticket: RemoteTicket) -> None:
        """Withdraw an admission (the client went away); releases it if it was granted or
        its Admit is in flight. ``withdrawn`` is set under the lock ``_admitted`` takes to
        record a grant and ``_send_admit`` takes to send a retry, so a grant arriving
        meanwhile is released here or there (once: ``released``), never kept, and no Admit
        is sent after it."""
        with self._lock:
            ticket.withdrawn = True
            waiting = self._pending.pop(ticket.request_id, None) is not None
            granted = self._live.pop(ticket.request_id, None) is not None
            call = ticket.call
            # an Admit sent and not resolved here may have been granted with the reply on its
            # way (its done callback then sees a cancelled call): release it as well, a no-op
            # at the controller if it was not granted
            release = (granted or (waiting and call is not None)) and not ticket.released
            ticket.released |= release
        if call is not None:
            call.cancel()
        if release:
            self._releases.put(ticket.request_id)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            tickets = list(self._pending.values())
        for t in tickets:
            self.cancel(t)
        if self._session_call is not None:
            self._session_call.cancel()
        if self._out is not None:
            self._out.put(None)
        self._releases.put(None)
        for t in self._threads:
            t.join(timeout=3)
        self._channel.close()

    # -- Admit ------------------------------------------------------------------------------
    def _call_admit(self, ticket: RemoteTicket) -> None:
        try:
            self._send_admit(ticket)
        except Exception as exc:   # e.g. from a retry timer's thread: fail it, never strand it
            self._fail_here(ticket, "sending its Admit", exc)

    def _send_admit(self, ticket: RemoteTicket) -> None:
        remaining = ticket.deadline - time.monotonic()
        if remaining <= 0:
            self._fail(ticket, errors.DeadlineExceeded(
                f"request {ticket.request_id}: not admitted within the admission deadline of "
                f"{self.admit_timeout_s:.0f}s (residency controller unreachable or busy)"))
            return
        req = pb.AdmitRequest(request_id=ticket.request_id, worker_id=self.worker_id,
                              required_pages=ticket.required_pages,
                              history_pages=ticket.history_pages)
        with self._lock:   # decided together with cancel(): a withdrawn ticket sends nothing
            if ticket.withdrawn or self._stop.is_set():
                return
            call = ticket.call = self._stub.Admit.future(
                req, timeout=remaining, wait_for_ready=True, metadata=self._metadata)
        call.add_done_callback(lambda c: self._admitted(ticket, c))

    def _admitted(self, ticket: RemoteTicket, call: grpc.Future) -> None:
        """Admit's done callback (a gRPC thread). Whatever goes wrong in here, the ticket
        ends granted, retried or failed: an exception escaping to gRPC would leave the
        request waiting for nothing until its client's deadline."""
        try:
            self._resolve_admit(ticket, call)
        except Exception as exc:
            self._fail_here(ticket, "resolving its Admit", exc)

    def _resolve_admit(self, ticket: RemoteTicket, call: grpc.Future) -> None:
        if call.cancelled():
            return
        exc = call.exception()
        if exc is None:
            r = call.result()
            grant = Grant(r.request_id, r.worker_id, r.worker_address, r.required_pages,
                          r.optional_pages, r.wait_seconds, tuple(r.reclaimed_requests))
            with self._lock:  # decided together with cancel(): see there
                keep = not (ticket.withdrawn or self._stop.is_set())
                if keep:
                    self._pending.pop(ticket.request_id, None)
                    self._live[ticket.request_id] = ticket
                    ticket.grant = grant
                    ticket.state = TicketState.GRANTED
                release = not keep and not ticket.released   # granted at the last instant
                ticket.released |= release
            if ticket.retries:
                log.info("admission of %s granted after %d retries (kept: %s)",
                         ticket.request_id, ticket.retries, keep)
            if release:
                self._releases.put(ticket.request_id)
            return
        if ticket.withdrawn or self._stop.is_set():
            return
        code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
        details = exc.details() if isinstance(exc, grpc.Call) else repr(exc)
        if code in RETRY_CODES and time.monotonic() < ticket.deadline:
            # The controller is down, or restarted and does not know this worker yet (the
            # session re-registers it): try again shortly.
            ticket.retries += 1
            if code.name != ticket.last_code:   # one line per change, not per attempt
                ticket.last_code = code.name
                log.info("admission of %s: %s (%s), retrying", ticket.request_id, code.name,
                         details)
            timer = threading.Timer(0.2, self._call_admit, (ticket,))
            timer.daemon = True
            timer.start()
            return
        if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ALREADY_EXISTS):
            # the controller may hold a grant nobody will run: one made as the deadline
            # passed, or one whose reply was lost before this retry (ALREADY_EXISTS: the
            # engine's ids are unique, so it is our own). Releasing an unknown request is
            # a no-op there.
            self._releases.put(ticket.request_id)
        err = domain_error(exc)
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            err = errors.DeadlineExceeded(
                f"request {ticket.request_id}: not admitted within the admission deadline of "
                f"{self.admit_timeout_s:.0f}s ({details})")
        else:
            err = type(err)(f"admission of {ticket.request_id}: {code.name}: {details}")
        self._fail(ticket, err)

    def _fail_here(self, ticket: RemoteTicket, what: str, exc: Exception) -> None:
        """An unexpected exception in this process while admitting: the request fails."""
        log.exception("admission of %s: %s failed", ticket.request_id, what)
        self._fail(ticket, errors.Unavailable(
            f"admission of {ticket.request_id} failed in this worker: {exc!r}"))

    def _fail(self, ticket: RemoteTicket, err: errors.DHiSparseError) -> None:
        with self._lock:
            self._pending.pop(ticket.request_id, None)
        ticket.error = err
        ticket.state = TicketState.CANCELLED

    # -- Session ----------------------------------------------------------------------------
    def _hello(self) -> pb.RegisterWorkerRequest:
        p = self.pool
        with self._lock:
            live = dict(self._live)
        return pb.RegisterWorkerRequest(
            worker_id=p.worker_id, address=p.address, capacity_pages=p.capacity_pages,
            reserve_pages=p.reserve_pages, page_rows=p.page_rows, page_bytes=p.page_bytes,
            request_slots=p.request_slots, requests=self._live_reports(live))

    def _session_forever(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                self._session_once()
                backoff = 0.1
            except grpc.RpcError as exc:
                if not self._stop.is_set():
                    code = exc.code() if isinstance(exc, grpc.Call) else None
                    log.warning("residency session lost (%s); reconnecting",
                                code.name if code else exc)
            except Exception:
                log.exception("residency session failed; reconnecting")
            self.connected.clear()
            self._stop.wait(backoff)
            backoff = min(2.0, backoff * 2)

    def _session_once(self) -> None:
        hello = self._hello()
        reply = self._stub.RegisterWorker(hello, timeout=5.0, metadata=self._metadata)
        with self._lock:  # before any call that can fail: a retry would see the epoch as old
            if reply.epoch != self.epoch:
                self._forget_commands()
            self.epoch = reply.epoch
        self._release_strangers()
        heartbeat = min(1.0, max(0.05, reply.heartbeat_timeout_s / 4))
        out: queue.Queue[pb.WorkerReport | None] = queue.Queue()
        with self._lock:
            self._out = out
        call = self._stub.Session(self._reports(self._hello(), out, heartbeat),
                                  metadata=self._metadata)
        self._session_call = call
        self.sessions += 1
        self.connected.set()
        log.info("residency session open", extra={"fields": {
            "worker": self.worker_id, "epoch": reply.epoch, "adopted": reply.adopted_requests}})
        try:
            for msg in call:
                kind = msg.WhichOneof("kind")
                if kind is None:
                    continue
                cmd = Command(msg.command_id, CommandKind(kind), self.worker_id,
                              msg.request_id, getattr(msg, kind).pages)
                with self._lock:
                    self._commands.append(cmd)
        finally:
            with self._lock:
                if self._out is out:
                    self._out = None
            out.put(None)

    def _reports(self, hello: pb.RegisterWorkerRequest, out: queue.Queue,
                 heartbeat_s: float) -> Iterator[pb.WorkerReport]:
        yield pb.WorkerReport(worker_id=self.worker_id, hello=hello)
        while True:
            try:
                msg = out.get(timeout=heartbeat_s)
            except queue.Empty:
                msg = pb.WorkerReport(worker_id=self.worker_id, heartbeat=True)
            if msg is None:
                return
            yield msg

    def _forget_commands(self) -> None:
        """A new controller (caller holds the lock): its command ids never collide with the
        old one's, and it rebuilt its ledger from this session's report, so the old one's
        commands not yet run are dropped (queued) or stop being ``current`` (taken)."""
        self._done.clear()
        self._commands.clear()
        self._taken.clear()

    def _send_ack(self, command_id: int, ok: bool, error: str = "") -> None:
        """Queue an ack on the live session (caller holds the lock). With no session the
        ack is dropped: the controller re-sends the command and ``_done`` re-acks it."""
        if self._out is not None:
            self._out.put(pb.WorkerReport(worker_id=self.worker_id, acks=[
                pb.CommandAck(command_id=command_id, ok=ok, error=error)]))

    def _release_strangers(self) -> None:
        """Release requests the controller holds for this worker that this process does
        not know: a previous incarnation's (killed) requests would pin pages forever."""
        state = self._stub.GetState(pb.GetStateRequest(worker_id=self.worker_id,
                                                       include_requests=True),
                                    timeout=5.0, metadata=self._metadata)
        for w in state.workers:
            for r in w.requests:
                with self._lock:
                    known = r.request_id in self._live or r.request_id in self._pending
                if not known:
                    log.info("releasing a stale request of this worker",
                             extra={"fields": {"request": r.request_id}})
                    self._releases.put(r.request_id)

    # -- Release ----------------------------------------------------------------------------
    def _release_forever(self) -> None:
        while (rid := self._releases.get()) is not None:
            backoff = 0.1
            while not self._stop.is_set():
                try:
                    self._stub.Release(pb.ReleaseRequest(request_id=rid,
                                                         worker_id=self.worker_id),
                                       timeout=5.0, metadata=self._metadata)
                    break
                except grpc.RpcError as exc:
                    code = exc.code() if isinstance(exc, grpc.Call) else None
                    if code in (grpc.StatusCode.NOT_FOUND,
                                grpc.StatusCode.FAILED_PRECONDITION):
                        break    # a restarted controller never knew it: nothing to free
                    if code is not grpc.StatusCode.UNAVAILABLE:
                        log.warning("release of %s failed: %s", rid, exc)
                        break
                    self._stop.wait(backoff)
                    backoff = min(1.0, backoff * 2)
