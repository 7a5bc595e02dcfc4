"""``HierarchyKV``: the model's ``KVAccess`` served by the KV hierarchy.

Per round and source group ``g`` (model group ``g`` ↔ hierarchy group ``"g{g}"``)::

    write_tail(g, 0, ...)   open_rows: reserve the round's tail rows, write payload 0
    write_tail(g, p, ...)   followers (GLM-like) write their own bytes at the same rows
    resolve(g, ...)         first finishes every earlier group of the round (its readers
                            are done: fence, release its staged rows, so the shared
                            staging arena is reused by this group), then one hierarchy
                            resolve → ResolvePlan (locations + host copies)
    pool(g, p)              applies the plan's host copies to payload p on first use, so
                            follower copies happen just before the layer that reads them
    finish_round()          every reader finished: fence, release staging

Counters of every plan accumulate in ``counts`` (what the metrics export). On CUDA the
fused kernels (``kernels.dropin``: same signatures, bit-identical plans and state) do
the resolve and the host copies; on the CPU the torch reference does.
"""

from __future__ import annotations

import torch

from services.common.errors import InvalidArgument
from services.decode.hierarchy import Hierarchy, SelectionCounts, open_rows
from services.decode.hierarchy import apply_copies as ref_apply_copies
from services.decode.hierarchy import resolve as ref_resolve
from services.decode.hierarchy.pages import device_ints, open_rows_batch
from services.decode.hierarchy.promotion import release_staging
from services.decode.hierarchy.resolver import ResolvePlan


class HierarchyKV:
    """Maps model request slots to hierarchy request ids and rounds to resolves."""

    def __init__(self, hierarchy: Hierarchy, groups: int, fused: bool | None = None) -> None:
        """``fused``: use the CUDA kernels (default: exactly when the hierarchy is on CUDA)."""
        self.h = hierarchy
        self._resolve, self._apply = ref_resolve, ref_apply_copies
        self._release = release_staging
        if fused is None:
            fused = hierarchy.config.torch_device.type == "cuda"
        if fused:
            from kernels import dropin as kernels  # CuPy is imported only on CUDA

            self._resolve, self._apply = kernels.resolve, kernels.apply_copies
            self._release = kernels.release_staging_async  # no host read per group
        self.names = [f"g{g}" for g in range(groups)]
        self.request_of: dict[int, str] = {}
        self.counts = SelectionCounts()
        self.copied_bytes = 0
        self._opened: dict[tuple[int, int], tuple[int, torch.Tensor]] = {}
        self._round: list[torch.Tensor] | None = None  # per group: tail rows of the round
        self._plans: dict[int, tuple[ResolvePlan, set[int]]] = {}
        # the round's batch as the engine passed it: resolve(slots=that tensor) maps slots
        # to request ids and opened rows without reading the slots back from the device
        self._round_slots: torch.Tensor | None = None
        self._round_ids: list[str] = []
        self._round_opened: dict[int, torch.Tensor] = {}  # group → tail_hi per request

    def begin_round(self, request_ids: list[str], counts: list[int],
                    slots: torch.Tensor | None = None) -> None:
        """Open this round's tail rows of every request in every group up front, in the
        model's query order (request-major), so ``write_tail`` / ``tail_rows`` of the
        round's own rows are one indexed copy each instead of a loop over requests.
        ``slots``: the slot tensor the model's ``resolve`` calls will pass (the engine's
        batch, in ``request_ids`` order)."""
        self._round = []
        opened: dict[tuple[int, ...], torch.Tensor] = {}
        for group, name in enumerate(self.names):
            g = self.h.group(name)
            self._round.append(open_rows_batch(g, request_ids, counts))
            if slots is not None:
                his = tuple(g.request(r).tail_hi for r in request_ids)
                if his not in opened:  # usually one copy per round: groups open alike
                    opened[his] = device_ints(his, g.device)
                self._round_opened[group] = opened[his]
        if slots is not None:
            self._round_slots, self._round_ids = slots, list(request_ids)

    # -- KVAccess ----------------------------------------------------------------------------
    def write_tail(self, group: int, payload: int, slots: torch.Tensor,
                   positions: torch.Tensor, rows: torch.Tensor) -> None:
        g = self.h.group(self.names[group])
        if self._round is not None:  # the round's own rows, opened by begin_round
            locs = self._round[group]
            if locs.numel() != rows.shape[0]:
                raise InvalidArgument(f"rows={rows.shape[0]} but the round opened "
                                      f"{locs.numel()} rows")
            g.payload(payload)[locs] = rows
            return
        for slot in torch.unique_consecutive(slots).tolist():
            mask = slots == slot
            pos = positions[mask]
            key = (group, slot)
            if key not in self._opened:
                state = g.request(self.request_of[slot])
                if int(pos[0]) != state.tail_hi:
                    raise InvalidArgument(
                        f"positions start at {int(pos[0])} but slot {slot} has opened rows "
                        f"up to {state.tail_hi}")
                self._opened[key] = (int(pos[0]), open_rows(g, state.request_id, pos.numel()))
            start, locs = self._opened[key]
            g.payload(payload)[locs[pos - start]] = rows[mask]

    def resolve(self, group: int, slots: torch.Tensor, selections: torch.Tensor,
                bounds: torch.Tensor) -> torch.Tensor:
        for earlier in [e for e in self._plans if e != group]:
            self._finish_group(earlier)
        g = self.h.group(self.names[group])
        if slots is self._round_slots and group in self._round_opened:
            rids, opened = self._round_ids, self._round_opened[group].to(bounds.device)
        else:
            rids = [self.request_of[int(s)] for s in slots.tolist()]
            opened = torch.tensor([g.request(r).tail_hi for r in rids], dtype=torch.int64,
                                  device=bounds.device)
        visible = torch.minimum(bounds, opened.view(-1, 1))  # padding queries see no more
        plan = self._resolve(g, rids, selections, visible)
        self.counts.add(plan.counts)
        self._plans[group] = (plan, set(range(g.spec.payload_layers)))
        return plan.locations

    def pool(self, group: int, payload: int) -> torch.Tensor:
        g = self.h.group(self.names[group])
        pending = self._plans.get(group)
        if pending is not None and payload in pending[1]:
            self._count_bytes(self._apply(g, pending[0], payload))
            pending[1].discard(payload)
        return g.payload(payload)

    def tail_rows(self, group: int, payload: int, slots: torch.Tensor,
                  positions: torch.Tensor) -> torch.Tensor:
        g = self.h.group(self.names[group])
        if self._round is not None and self._round[group].numel() == positions.numel():
            return g.payload(payload)[self._round[group]]
        locs = torch.empty_like(positions)
        for slot in torch.unique(slots).tolist():
            mask = slots == slot
            state = g.request(self.request_of[slot])
            locs[mask] = state.tail_locs[positions[mask] % state.tail_locs.numel()]
        return g.payload(payload)[locs]

    # -- engine side -------------------------------------------------------------------------
    def _count_bytes(self, copied: int) -> None:
        self.copied_bytes += copied
        self.counts.host_bytes += copied

    def _finish_group(self, group: int) -> None:
        """Readers of ``group`` finished: apply leftover copies, fence, release its staged
        rows (promoted rows are copied back to hot slots first)."""
        plan, layers = self._plans.pop(group)
        g = self.h.group(self.names[group])
        for layer in sorted(layers):
            self._count_bytes(self._apply(g, plan, layer))
        g.readers_finished(plan.epoch)
        self._release(g)

    def finish_round(self) -> None:
        """Every attention reader of this round finished."""
        for group in list(self._plans):
            self._finish_group(group)
        self._opened.clear()
        self._round = None
        self._round_slots, self._round_ids, self._round_opened = None, [], {}
        self.h.readers_finished()
