"""The model's only view of KV payload storage: the ``KVAccess`` protocol, and ``DenseKV``.

The model never knows where rows live. Per layer group ``g`` (see ``ModelConfig``) there
are ``payloads_per_group`` payload sources ``(g, p)`` of ``row_bytes``-byte rows. One
forward pass over a batch calls, per group::

    write_tail(g, p, slots, positions, rows)  for every payload p the group produces,
                                              before anything of this round is read
    resolve(g, slots, selections, bounds)     once: one selection serves all payloads
    pool(g, p)[locations]                     when layer (g, p) attends
    tail_rows(g, p, slots, positions)         each query's own (diagonal) row

Query ``j`` of request ``b`` sits at position ``n_b + j``; its selection draws from the
positions ``s < bounds[b, j] = n_b + j`` (eq. 5 without the query itself). Positions
``< n_b`` are committed history; ``n_b .. n_b + j - 1`` are this round's current block,
written to the tail by ``write_tail`` before ``resolve`` is called, so an implementation
resolves those directly from its tail. Padding entries (``-1``) cost nothing and get
location ``-1``. A location indexes *every* payload pool of the group, so a GLM follower
layer reads its own bytes at the location resolved for the group's producer. Rows of
positions ``>= n_b`` are speculative until the engine commits them (eq. 7).
"""

from __future__ import annotations

from typing import Protocol

import torch

from services.common.errors import InvalidArgument, ResourceExhausted


class KVAccess(Protocol):
    """Storage of payload rows, seen by the model. Implementations: ``DenseKV``, hierarchy."""

    def write_tail(self, group: int, payload: int, slots: torch.Tensor,
                   positions: torch.Tensor, rows: torch.Tensor) -> None:
        """Store this round's rows: ``slots, positions int64 [N]``, ``rows uint8 [N, R]``."""

    def resolve(self, group: int, slots: torch.Tensor, selections: torch.Tensor,
                bounds: torch.Tensor) -> torch.Tensor:
        """``slots [B]``, ``selections int64 [B, K, k]`` (-1 = padding) in the model's
        order, ``bounds int64 [B, K]`` (exclusive) → ``locations int64 [B, K, k]`` into
        ``pool(group, p)`` for every payload ``p``; -1 where the selection is -1."""

    def pool(self, group: int, payload: int) -> torch.Tensor:
        """``uint8 [P, R]``: the tensor that ``locations`` index for payload ``(g, p)``."""

    def tail_rows(self, group: int, payload: int, slots: torch.Tensor,
                  positions: torch.Tensor) -> torch.Tensor:
        """``slots, positions int64 [N]`` → ``uint8 [N, R]`` rows of this round's block."""


class DenseKV:
    """Every row of every request slot in one dense device tensor per payload source.

    The "resident" baseline and the test double of ``KVAccess``: row ``(slot, position)``
    lives at location ``slot · max_positions + position``. ``resolve`` checks exactness
    preconditions (a selection below its bound, a written row) and raises on violation.
    """

    def __init__(self, groups: int, payloads: int, row_bytes: int, slots: int,
                 max_positions: int, device: str | torch.device = "cpu") -> None:
        for name, v in (("groups", groups), ("payloads", payloads), ("row_bytes", row_bytes),
                        ("slots", slots), ("max_positions", max_positions)):
            if v < 1:
                raise InvalidArgument(f"{name}={v} must be >= 1")
        self.max_positions = max_positions
        self.slots = slots
        shape = (slots * max_positions, row_bytes)
        self._pools = [[torch.zeros(shape, dtype=torch.uint8, device=device)
                        for _ in range(payloads)] for _ in range(groups)]
        self._written = torch.zeros(groups, payloads, slots * max_positions, dtype=torch.bool,
                                    device=device)

    @classmethod
    def for_model(cls, cfg, slots: int, max_positions: int) -> DenseKV:
        return cls(cfg.groups, cfg.payloads_per_group, cfg.row_bytes, slots, max_positions,
                   cfg.device)

    def _loc(self, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if positions.numel() and int(positions.max()) >= self.max_positions:
            raise ResourceExhausted(f"position={int(positions.max())} exceeds "
                                    f"max_positions={self.max_positions}")
        return slots * self.max_positions + positions

    def write_tail(self, group, payload, slots, positions, rows) -> None:
        loc = self._loc(slots, positions)
        self._pools[group][payload][loc] = rows
        self._written[group, payload, loc] = True

    def resolve(self, group, slots, selections, bounds) -> torch.Tensor:
        valid = selections >= 0
        if bool((valid & (selections >= bounds.unsqueeze(-1))).any()):
            raise InvalidArgument("selections must lie below their query's bound")
        loc = torch.where(valid, slots.view(-1, 1, 1) * self.max_positions + selections,
                          torch.full_like(selections, -1))
        if not bool(self._written[group, 0, loc[valid]].all()):  # payload 0 is written first
            raise InvalidArgument("a selection refers to a row that was never written")
        return loc

    def pool(self, group, payload) -> torch.Tensor:
        return self._pools[group][payload]

    def tail_rows(self, group, payload, slots, positions) -> torch.Tensor:
        return self._pools[group][payload][self._loc(slots, positions)]

    # -- engine-side helpers -------------------------------------------------------------
    def rollback(self, slot: int, n: int) -> None:
        """Forget rows at positions ``>= n`` of ``slot`` (rejected speculative rows)."""
        base = slot * self.max_positions
        self._written[:, :, base + n: base + self.max_positions] = False

    def import_rows(self, slot: int, rows: dict[tuple[int, int], torch.Tensor]) -> None:
        """Write a prepared prefix: ``rows[(g, p)] uint8 [T, R]`` at positions ``0 .. T-1``."""
        for (g, p), r in rows.items():
            pos = torch.arange(r.shape[0], device=r.device)
            self.write_tail(g, p, torch.full_like(pos, slot), pos, r)

    def export_rows(self, slot: int, n: int) -> dict[tuple[int, int], torch.Tensor]:
        """Rows of positions ``0 .. n-1`` of ``slot`` per payload source ``(g, p)``."""
        base = slot * self.max_positions
        return {(g, p): pool[base: base + n].clone()
                for g, pools in enumerate(self._pools) for p, pool in enumerate(pools)}
