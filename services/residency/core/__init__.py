"""Residency policy core (paper §3.1): plain Python, no gRPC, usable in-process."""

from __future__ import annotations

from services.residency.core.ledger import RequestEntry, WorkerLedger
from services.residency.core.model import (
                                           AdmitSpec,
                                           Command,
                                           CommandKind,
                                           Grant,
                                           PolicyConfig,
                                           PolicyKind,
                                           ReclaimOrder,
                                           RequestReport,
                                           Ticket,
                                           TicketState,
                                           WorkerSpec,
)
from services.residency.core.residency import ResidencyCore

__all__ = [
    "AdmitSpec", "Command", "CommandKind", "Grant", "PolicyConfig", "PolicyKind",
    "ReclaimOrder", "RequestEntry", "RequestReport", "ResidencyCore", "Ticket", "TicketState",
    "WorkerLedger", "WorkerSpec",
]
