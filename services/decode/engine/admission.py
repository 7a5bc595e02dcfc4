"""Admission through the residency policy core, in process.

The engine admits every request through the same ``ResidencyCore`` the residency service
runs (DESIGN.md §4), here in-process for one worker. The core answers with tickets and
issues Backup / Retire / Populate commands, which the engine executes on its hierarchy
and acknowledges. The decode service swaps this for a gRPC client with the same shape.
"""

from __future__ import annotations

from collections.abc import Callable

from services.residency.core import (
    AdmitSpec,
    Command,
    PolicyConfig,
    ResidencyCore,
    Ticket,
    TicketState,
    WorkerSpec,
)


class LocalAdmission:
    """One worker's ledger in an in-process ``ResidencyCore``."""

    def __init__(self, worker_id: str, capacity_pages: int, reserve_pages: int,
                 request_slots: int, policy: PolicyConfig | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        kwargs = {"clock": clock} if clock is not None else {}
        self.core = ResidencyCore(policy or PolicyConfig(), **kwargs)
        self.worker_id = worker_id
        self.core.register_worker(WorkerSpec(worker_id, capacity_pages, reserve_pages,
                                             request_slots))

    def admit(self, request_id: str, required_pages: int, history_pages: int) -> Ticket:
        return self.core.admit(AdmitSpec(request_id, required_pages, history_pages,
                                         self.worker_id))

    @staticmethod
    def granted(ticket: Ticket) -> bool:
        return ticket.state is TicketState.GRANTED

    def take_commands(self) -> list[Command]:
        return self.core.take_commands(self.worker_id)

    @staticmethod
    def current(command: Command) -> bool:
        """Whether ``command`` is still the controller's to run: always, in process (the
        remote admission drops a replaced controller's)."""
        return True

    def ack(self, command: Command, ok: bool = True) -> None:
        self.core.ack(command.command_id, self.worker_id, ok)

    def release(self, request_id: str) -> None:
        self.core.release(request_id)

    @property
    def waiting(self) -> int:
        return len(self.core.waiting)
