"""Decision records kept when ``PolicyConfig.trace_limit > 0``, read by the invariant
checkers: every admission, command issue/ack, release, and every eq. 4 selection."""

from __future__ import annotations

from dataclasses import dataclass

from services.residency.core.model import CommandKind, ReclaimOrder


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """``kind``: admit | adopt | issue | ack | release | drop. ``fully_backed`` is the
    request's state when the event was recorded (for an ack: before applying it)."""

    kind: str
    worker_id: str
    request_id: str
    command: CommandKind | None
    command_id: int
    pages: int
    fully_backed: bool
    ok: bool = True


@dataclass(frozen=True, slots=True)
class Candidate:
    request_id: str
    pages: int           # a_r
    fully_backed: bool
    seq: int             # admission order


@dataclass(frozen=True, slots=True)
class ReclaimDecision:
    """One eq. 4 selection: the candidates in the order the policy walked them."""

    worker_id: str
    deficit: int
    order: ReclaimOrder
    candidates: tuple[Candidate, ...]
    chosen: tuple[str, ...]
