"""A source group: the unit of resolution (one selection -> one location vector).

Shared by every payload layer of the group: the page pool layout, the per-request
metadata (tail, hot-cache slot table, optional-history map) and the reader epochs.
Per payload layer: one pool tensor ``uint8 [pool_rows, row_bytes]`` and one host
backing per request. Because the layout is shared, a location is valid in every
payload layer of the group; the bytes arrive per layer through ``apply_copies``.

Reader epochs (I4): every resolve opens epoch ``clock + 1`` and stamps what it returns.
The engine calls ``readers_finished(epoch)`` once every attention reader of resolves up to
``epoch`` completed. Hot slots, staged rows and optional pages read in an epoch newer
than ``finished_epoch`` are protected: not evicted, released or retired.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.common.backing import HostBackingProvider
from services.common.errors import FailedPrecondition, InvalidArgument, NotFound

from .config import HierarchyConfig, SourceSpec, is_int
from .counters import SelectionCounts
from .pool import PagePool
from .request import RequestState
from .staging import StagingArena, StagingView


@dataclass(frozen=True, slots=True)
class SharedLayout:
    """Where a group lives inside tensors shared with other groups (see staging.py):
    its payload views (all starting at row 0 of the shared tensors), the first page id
    it owns, and the staging arena it shares."""

    payloads: list[torch.Tensor]
    first_page: int
    arena: StagingArena


class SourceGroup:
    """Device tiers of one source group on one decode worker."""

    def __init__(
        self,
        spec: SourceSpec,
        config: HierarchyConfig,
        source_ids: Sequence[int] | None = None,
        provider: HostBackingProvider | None = None,
        *,
        layout: SharedLayout | None = None,
    ) -> None:
        source_ids = tuple(range(spec.payload_layers)) if source_ids is None else tuple(source_ids)
        if len(source_ids) != spec.payload_layers:
            raise InvalidArgument(
                f"source_ids has {len(source_ids)} ids; expected "
                f"payload_layers={spec.payload_layers}"
            )
        if config.offloads and provider is None:
            raise InvalidArgument(f"provider=None but policy={config.policy!r} needs host backing")
        self.spec = spec
        self.config = config
        self.source_ids = source_ids
        self.provider = provider
        # resolved device ("cuda" -> "cuda:0") so tensor device checks compare equal
        self.device = torch.empty(0, device=config.torch_device).device
        self.staging: StagingArena | StagingView
        if layout is None:
            self.payloads = [
                torch.zeros(config.pool_rows, spec.row_bytes, dtype=torch.uint8,
                            device=self.device)
                for _ in range(spec.payload_layers)
            ]
            self.pages = PagePool(config.num_pages, config.reserve_pages)
            self.staging = StagingArena(config.num_pages * config.page_rows,
                                        config.staging_rows)
        else:
            self.payloads = layout.payloads
            self.pages = PagePool(config.num_pages, config.reserve_pages, layout.first_page)
            self.staging = StagingView(layout.arena, spec.name)
        self.requests: dict[str, RequestState] = {}
        self.clock = 0  # epoch of the latest resolve
        self.finished_epoch = 0  # every reader of epochs <= this finished
        self.pending_epoch = 0  # epoch of the plan whose copies are not yet applied everywhere
        self.pending_layers: set[int] = set()
        self.counters = SelectionCounts()

    # -- lookups -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def hot_slots(self) -> int:
        return self.config.hot_slots if self.config.offloads else 0

    def request(self, request_id: str) -> RequestState:
        state = self.requests.get(request_id)
        if state is None:
            raise NotFound(
                f"request_id={request_id!r} is not admitted in source group {self.name!r}"
            )
        return state

    def payload(self, layer: int) -> torch.Tensor:
        """Pool tensor ``uint8 [pool_rows, row_bytes]`` of payload layer ``layer``."""
        self.check_layer(layer)
        return self.payloads[layer]

    def check_layer(self, layer: int) -> None:
        if not is_int(layer) or not 0 <= layer < self.spec.payload_layers:
            raise InvalidArgument(
                f"layer={layer!r} outside payload layers [0, {self.spec.payload_layers}) "
                f"of source group {self.name!r}"
            )

    def backed_mask(self, state: RequestState) -> torch.Tensor:
        """``bool [max_rows]`` (CPU): rows backed on host in every payload layer."""
        mask = torch.zeros(state.max_rows, dtype=torch.bool)
        if state.backings:
            mask[:] = True
            for backing in state.backings:
                mask &= backing.backed_mask()[: state.max_rows]
        return mask

    def page_locations(self, pages: torch.Tensor) -> torch.Tensor:
        """Pool rows ``int64 [len(pages) * p]`` of physical ``pages`` (in order)."""
        p = self.config.page_rows
        offsets = torch.arange(p, device=pages.device)
        return (pages[:, None] * p + offsets).flatten()

    # -- reader fence ----------------------------------------------------------------------
    def readers_finished(self, epoch: int | None = None) -> None:
        """Every reader of resolves up to ``epoch`` (default: the latest) has finished. Not
        while a plan of such a resolve has layers whose copies are not applied: their readers
        have not read yet (a fence then would free slots the copies still land in)."""
        epoch = self.clock if epoch is None else epoch
        if not self.finished_epoch <= epoch <= self.clock:
            raise InvalidArgument(
                f"epoch={epoch} must lie in [finished_epoch={self.finished_epoch}, "
                f"clock={self.clock}]"
            )
        if self.pending_layers and epoch >= self.pending_epoch:
            raise FailedPrecondition(
                f"epoch={epoch}: the plan of epoch={self.pending_epoch} is not applied to "
                f"payload layers {sorted(self.pending_layers)}; apply_copies before its "
                f"readers finish"
            )
        self.finished_epoch = epoch

    def readers_pending(self, state: RequestState) -> bool:
        return state.last_read_epoch > self.finished_epoch

    def note_read(self, state: RequestState, epoch: int) -> None:
        """Readers of ``epoch`` resolved ``state``'s rows: the tail they may hold widens to
        cover the current tail (``open_rows`` keeps its slots until every reader finished);
        with no reader pending it is the current tail."""
        if self.readers_pending(state):  # earlier readers still hold their slots; read_tail_lo
            # stays (tail_lo only grows)
            state.read_tail_hi = max(state.read_tail_hi, state.tail_hi)
        else:
            state.read_tail_lo, state.read_tail_hi = state.tail_lo, state.tail_hi
        state.last_read_epoch = epoch
