"""RemoteAdmission: a cancel racing the grant of the same ticket never strands the grant."""

from __future__ import annotations

import time

import pytest

from services.common.gen.dhisparse.v1 import residency_pb2 as pb
from services.decode.remote_admission import (
    RemoteAdmission,
    RemoteTicket,
    TicketState,
    WorkerPool,
)


class GrantedCall:
    """A finished Admit call that granted the ticket; ``cancel_at`` runs the engine
    thread's ``cancel`` inside ``exception()`` or ``result()``, i.e. between the callback's
    steps."""

    def __init__(self, adm: RemoteAdmission, ticket: RemoteTicket, cancel_at: str) -> None:
        self.adm, self.ticket, self.cancel_at = adm, ticket, cancel_at

    def cancelled(self) -> bool:
        return False

    def cancel(self) -> bool:
        return False

    def exception(self):
        if self.cancel_at == "exception":
            self.adm.cancel(self.ticket)
        return None

    def result(self) -> pb.AdmitResponse:
        if self.cancel_at == "result":
            self.adm.cancel(self.ticket)
        return pb.AdmitResponse(request_id=self.ticket.request_id, worker_id="w")


@pytest.mark.parametrize("cancel_at", ["exception", "result", "after"])
def test_cancel_racing_a_grant_releases_it(cancel_at: str) -> None:
    adm = RemoteAdmission("127.0.0.1:1", WorkerPool("w", "x", 10, 0, 2, 8, 8), lambda live: [])
    released: list[str] = []
    put = adm._releases.put
    adm._releases.put = lambda item, *a, **kw: (released.append(item), put(item, *a, **kw))
    try:
        ticket = RemoteTicket("r", 1, 0, time.monotonic() + 5)
        adm._pending["r"] = ticket
        adm._admitted(ticket, GrantedCall(adm, ticket, cancel_at))
        if cancel_at == "after":
            assert ticket.state is TicketState.GRANTED
            adm.cancel(ticket)
        assert "r" not in adm._live and "r" not in adm._pending
        assert released == ["r"]  # exactly one release reaches the controller
    finally:
        adm.close()


class FailedCall:
    """A finished Admit call that failed with ``code``."""

    def __init__(self, code) -> None:
        import grpc

        class Error(grpc.RpcError, grpc.Call):
            def code(self):
                return code

            def details(self):
                return f"{code.name} (test)"

            def initial_metadata(self):
                return ()

            def trailing_metadata(self):
                return ()

            def is_active(self):
                return False

            def time_remaining(self):
                return None

            def cancel(self):
                return False

            def add_callback(self, callback):
                return False

        self.error = Error()

    def cancelled(self) -> bool:
        return False

    def exception(self):
        return self.error


@pytest.mark.parametrize("code_name", ["DEADLINE_EXCEEDED", "ALREADY_EXISTS", "INVALID_ARGUMENT"])
def test_a_failed_admit_that_may_have_been_granted_is_released(code_name: str) -> None:
    """A grant made as the deadline passed, or one whose reply was lost before a retry
    (ALREADY_EXISTS), would hold pages nobody runs: the worker releases the request; a
    plain refusal releases nothing."""
    import grpc

    adm = RemoteAdmission("127.0.0.1:1", WorkerPool("w", "x", 10, 0, 2, 8, 8), lambda live: [])
    released: list[str] = []
    put = adm._releases.put
    adm._releases.put = lambda item, *a, **kw: (released.append(item), put(item, *a, **kw))
    try:
        ticket = RemoteTicket("r", 1, 0, time.monotonic() - 1)  # past its deadline: no retry
        adm._pending["r"] = ticket
        adm._admitted(ticket, FailedCall(getattr(grpc.StatusCode, code_name)))
        assert ticket.state is TicketState.CANCELLED and ticket.error is not None
        assert released == ([] if code_name == "INVALID_ARGUMENT" else ["r"])
    finally:
        adm.close()


class BrokenCall:
    """A finished Admit call whose outcome is not a gRPC status (``exception()`` gives a
    plain exception) or cannot be read at all (``result()`` raises)."""

    def __init__(self, how: str) -> None:
        self.how = how

    def cancelled(self) -> bool:
        return False

    def exception(self):
        return RuntimeError("transport fell over") if self.how == "plain" else None

    def result(self):
        raise RuntimeError("unreadable reply")


@pytest.mark.parametrize("how", ["plain", "unreadable"])
def test_an_admit_outcome_the_worker_cannot_read_fails_the_ticket(how: str) -> None:
    """The done callback never leaves a ticket waiting: an exception escaping to gRPC's
    thread stranded the request until its client's deadline."""
    adm = RemoteAdmission("127.0.0.1:1", WorkerPool("w", "x", 10, 0, 2, 8, 8), lambda live: [])
    try:
        ticket = RemoteTicket("r", 1, 0, time.monotonic() + 5)
        adm._pending["r"] = ticket
        adm._admitted(ticket, BrokenCall(how))
        assert ticket.state is TicketState.CANCELLED and ticket.error is not None
        assert "r" not in adm._pending and "r" not in adm._live
    finally:
        adm.close()


def test_an_admit_that_cannot_be_sent_fails_the_ticket(monkeypatch) -> None:
    """A retry runs on a timer thread: an exception sending the Admit fails the ticket
    instead of dying with the thread."""
    adm = RemoteAdmission("127.0.0.1:1", WorkerPool("w", "x", 10, 0, 2, 8, 8), lambda live: [])
    try:
        def boom(*a, **kw):
            raise ValueError("channel closed")

        monkeypatch.setattr(adm._stub.Admit, "future", boom, raising=False)
        ticket = adm.admit("r", 1, 0)
        assert ticket.state is TicketState.CANCELLED and "channel closed" in str(ticket.error)
        assert adm.waiting == 0
    finally:
        adm.close()


class InFlightCall:
    """An Admit call still in flight; ``cancel`` turns it cancelled, as gRPC does."""

    def __init__(self) -> None:
        self.is_cancelled = False

    def cancelled(self) -> bool:
        return self.is_cancelled

    def cancel(self) -> bool:
        self.is_cancelled = True
        return True


def recording_releases(adm: RemoteAdmission) -> list[str]:
    released: list[str] = []
    put = adm._releases.put
    adm._releases.put = lambda item, *a, **kw: (released.append(item), put(item, *a, **kw))
    return released


def test_cancel_of_an_admit_in_flight_releases_it_once() -> None:
    """The controller may have granted an Admit whose reply is still on its way when the
    client goes away; the done callback then sees a cancelled call. The cancel releases the
    request (a no-op there if it was not granted), and only once."""
    adm = RemoteAdmission("127.0.0.1:1", WorkerPool("w", "x", 10, 0, 2, 8, 8), lambda live: [])
    released = recording_releases(adm)
    try:
        ticket = RemoteTicket("r", 1, 0, time.monotonic() + 5)
        ticket.call = call = InFlightCall()
        adm._pending["r"] = ticket
        adm.cancel(ticket)
        assert call.is_cancelled and released == ["r"]
        adm._admitted(ticket, call)                        # the callback of the cancelled call
        adm._admitted(ticket, GrantedCall(adm, ticket, "after"))  # or a grant read after all
        adm.cancel(ticket)
        assert released == ["r"] and "r" not in adm._live and "r" not in adm._pending
    finally:
        adm.close()


def test_a_cancel_between_retries_sends_no_more_admits(monkeypatch) -> None:
    """A ticket withdrawn while its Admit waits for a retry timer sends nothing more: a
    fresh Admit would wait at the head of the controller's queue for its whole deadline."""
    adm = RemoteAdmission("127.0.0.1:1", WorkerPool("w", "x", 10, 0, 2, 8, 8), lambda live: [])
    sent: list[str] = []
    monkeypatch.setattr(adm._stub.Admit, "future",
                        lambda req, **kw: (sent.append(req.request_id), InFlightCall())[1],
                        raising=False)
    try:
        ticket = RemoteTicket("r", 1, 0, time.monotonic() + 5)
        adm._pending["r"] = ticket
        adm._call_admit(ticket)                  # the first Admit
        adm._admitted(ticket, FailedCall(__import__("grpc").StatusCode.UNAVAILABLE))
        assert ticket.retries == 1               # a retry timer runs in 0.2 s
        adm.cancel(ticket)
        time.sleep(0.4)
        adm._call_admit(ticket)                  # as the timer would, once more
        assert sent == ["r"]
    finally:
        adm.close()


def test_acknowledged_command_ids_are_kept_up_to_a_bound(monkeypatch) -> None:
    """``_done`` answers re-sent commands; it keeps the last DONE_KEPT ids, not every id of
    the worker's life."""
    from services.decode import remote_admission as ra
    from services.residency.core import Command, CommandKind

    monkeypatch.setattr(ra, "DONE_KEPT", 5)
    adm = RemoteAdmission("127.0.0.1:1", WorkerPool("w", "x", 10, 0, 2, 8, 8), lambda live: [])
    try:
        for i in range(12):
            adm.ack(Command(i, CommandKind.RETIRE, "w", "r", 1))
        assert list(adm._done) == [7, 8, 9, 10, 11]
    finally:
        adm.close()


def test_a_replaced_controllers_commands_are_not_run() -> None:
    """After a new epoch the old controller's commands are dropped if still queued and stop
    being current if the engine holds them (its successor rebuilt the ledger without
    them); a command re-sent while the engine holds it is not handed out twice."""
    from services.residency.core import Command, CommandKind

    adm = RemoteAdmission("127.0.0.1:1", WorkerPool("w", "x", 10, 0, 2, 8, 8), lambda live: [])
    try:
        adm._live["r"] = RemoteTicket("r", 1, 0, time.monotonic() + 5)
        held, queued = (Command(i, CommandKind.POPULATE, "w", "r", 2) for i in (1, 2))
        adm._commands.append(held)
        assert adm.take_commands() == [held] and adm.current(held)
        adm._commands.append(held)                   # re-sent while the engine holds it
        assert adm.take_commands() == []
        adm._commands.append(queued)
        with adm._lock:
            adm._forget_commands()
        assert not adm.current(held) and adm.take_commands() == []
    finally:
        adm.close()


def test_a_new_controller_is_recognised_even_if_the_session_setup_then_fails() -> None:
    """RegisterWorker reaches a new controller, then the stranger check (GetState) fails:
    the retry must still treat the old controller's commands as gone (the epoch was taken
    before the forget once, so a failed setup kept them current for good)."""
    import grpc

    from services.residency.core import Command, CommandKind

    class Unavailable(grpc.RpcError, grpc.Call):
        def code(self):
            return grpc.StatusCode.UNAVAILABLE

        def details(self):
            return "controller restarting (test)"

    class SessionOpened(Exception):
        pass

    adm = RemoteAdmission("127.0.0.1:1", WorkerPool("w", "x", 10, 0, 2, 8, 8), lambda live: [])
    adm._stop.set()  # the session thread stays out of the way
    try:
        adm.epoch = 111
        adm._live["r"] = RemoteTicket("r", 1, 0, time.monotonic() + 5)
        held = Command((111 << 32) + 1, CommandKind.POPULATE, "w", "r", 2)
        adm._commands.append(held)
        assert adm.take_commands() == [held]
        adm._commands.append(Command((111 << 32) + 2, CommandKind.RETIRE, "w", "r", 1))
        get_states = []

        def get_state(*a, **kw):
            get_states.append(1)
            if len(get_states) == 1:
                raise Unavailable()
            return pb.GetStateResponse()

        def session(*a, **kw):
            raise SessionOpened()

        class Stub:
            RegisterWorker = staticmethod(lambda *a, **kw: pb.RegisterWorkerResponse(
                epoch=222, heartbeat_timeout_s=10))
            GetState = staticmethod(get_state)
            Session = staticmethod(session)

        adm._stub = Stub()
        with pytest.raises(grpc.RpcError):
            adm._session_once()
        with pytest.raises(SessionOpened):
            adm._session_once()
        assert adm.epoch == 222 and not adm.current(held) and adm.take_commands() == []
    finally:
        adm.close()
