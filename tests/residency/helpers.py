"""Shared test helpers: a fake clock, a full-state fingerprint, a command pump."""

from __future__ import annotations

from services.residency.core import CommandKind, ResidencyCore


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def fingerprint(core: ResidencyCore) -> tuple:
    """Everything observable about the core's state (for 'unchanged on failure')."""
    workers = tuple(sorted(
        (wid, w.spec, w.required, w.allocated, w.ready, w.populating, w.populate_cursor,
         tuple((e.request_id, e.required, e.history, e.allocated, e.ready, e.backed, e.seq,
                e.pending, e.retire_pages) for e in w.requests.values()))
        for wid, w in core.workers.items()))
    waiting = tuple((t.ticket_id, t.spec, t.state, t.pledged_worker) for t in core.waiting)
    return workers, waiting, tuple(sorted(core.commands.items()))


def pump(core: ResidencyCore, worker_id: str, kinds: tuple[CommandKind, ...] = tuple(CommandKind),
         rounds: int = 100) -> list[tuple[str, str, int]]:
    """Deliver and acknowledge commands of ``kinds`` until none is left; returns
    (kind, request, pages) in issue order."""
    done = []
    for _ in range(rounds):
        cmds = [c for c in core.take_commands(worker_id) if c.kind in kinds]
        if not cmds:
            return done
        for c in cmds:
            done.append((c.kind.value, c.request_id, c.pages))
            core.ack(c.command_id, worker_id)
    return done
