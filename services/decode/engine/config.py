"""Engine configuration: the policy, the model preset, the KV budget and the tiers.

Every option name matches its ``dhisparse bench serve`` flag; a bad value raises
``InvalidArgument`` naming the flag, the value and the constraint.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.config import parse_size
from services.common.errors import InvalidArgument
from services.decode.engine.policies import Policy, get_policy
from services.decode.hierarchy import HierarchyConfig, SourceSpec
from services.decode.hierarchy.config import ceil_div
from services.decode.model.config import ModelConfig, preset


def _positive(flag: str, value: object, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidArgument(f"--{flag}={value!r}: must be an integer >= {minimum}")
    return value


@dataclass(slots=True)
class EngineConfig:
    """One decode worker's serving configuration.

    kv_memory is the KV budget M (pages of every source group, bytes as a human size);
    hot_cache is B rows per request and source group; spec_block is K_max (target queries
    per speculative round, anchor included).
    """

    policy: str = "adaptive"
    preset: str = "tiny"
    kv_memory: str | int = "2MiB"
    hot_cache: int = 16
    top_k: int | None = None
    page_rows: int = 16
    max_requests: int = 16
    max_context: int = 1024
    reserve_pages: int = 0
    spec_block: int = 4
    spec_mode: str = "fixed"
    draft_window: int = 16
    draft_layers: int = 1
    topology: str | None = None
    batch_invariant: bool = False
    device: str = "cpu"
    seed: int = 0
    temperature: float = 0.0
    populate_pages: int = 4
    model_overrides: dict[str, object] = field(default_factory=dict)
    _policy: Policy = field(init=False, repr=False)
    _model: ModelConfig = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._policy = get_policy(self.policy)
        for flag in ("hot_cache", "page_rows", "max_requests", "max_context", "spec_block",
                     "draft_window", "draft_layers", "populate_pages"):
            _positive(flag.replace("_", "-"), getattr(self, flag))
        _positive("reserve-pages", self.reserve_pages, 0)
        if self.temperature < 0:
            raise InvalidArgument(f"--temperature={self.temperature}: must be >= 0")
        if self.spec_mode not in ("fixed", "confidence"):
            raise InvalidArgument(f"--spec-mode={self.spec_mode!r}: expected fixed or confidence")
        overrides = dict(self.model_overrides)
        if self.top_k is not None:
            overrides["top_k"] = _positive("top-k", self.top_k)
        if self.topology is not None:
            if self.topology not in ("glm", "deepseek"):
                raise InvalidArgument(f"--topology={self.topology!r}: expected glm or deepseek")
            overrides["topology"] = self.topology
        overrides.update(batch_invariant=self.batch_invariant, device=self.device,
                         seed=self.seed)
        try:
            self._model = preset(self.preset, **overrides)
        except InvalidArgument as exc:
            raise InvalidArgument(f"--preset={self.preset!r}: {exc}") from None
        if self.draft_layers > self._model.layers:
            raise InvalidArgument(f"--draft-layers={self.draft_layers}: must be <= the "
                                  f"model's layers={self._model.layers}")
        budget = parse_size(self.kv_memory, "--kv-memory")
        need = (self.required_pages + self.reserve_pages + 1) * self.page_bytes
        if budget < need:
            raise InvalidArgument(
                f"--kv-memory={self.kv_memory}: {budget} bytes is smaller than one request's "
                f"required memory plus the reserve ({need} bytes = "
                f"{self.required_pages + self.reserve_pages + 1} pages of {self.page_bytes} B)")

    @property
    def policy_(self) -> Policy:
        return self._policy

    @property
    def model(self) -> ModelConfig:
        return self._model

    @property
    def k_max(self) -> int:
        return self.spec_block if self._policy.speculative else 1

    @property
    def tail_rows(self) -> int:
        """Tail ring: a full page plus one round's rows (never lent)."""
        return self.page_rows * ceil_div(self.page_rows + self.k_max + 1, self.page_rows)

    @property
    def page_bytes(self) -> int:
        """Bytes of one ledger page: ``page_rows`` rows in every payload source."""
        m = self._model
        return self.page_rows * m.groups * m.payloads_per_group * m.row_bytes

    @property
    def num_pages(self) -> int:
        return parse_size(self.kv_memory, "--kv-memory") // self.page_bytes

    @property
    def required_pages(self) -> int:
        """Pages the smallest request holds from admission to release."""
        return self.required_pages_for(1)

    def required_pages_for(self, max_rows: int) -> int:
        """Pages a request of ``max_rows`` rows holds from admission to release: tail and
        hot cache; under a resident policy the whole history instead of the hot cache."""
        tail = ceil_div(self.tail_rows, self.page_rows)
        if self._policy.resident:
            return tail + ceil_div(max_rows, self.page_rows)
        return tail + ceil_div(self.hot_cache, self.page_rows)

    @property
    def staging_rows(self) -> int:
        """Overflow arena rows per source group: N · K_max · k (paper §3.4)."""
        if self._policy.resident:
            return 0
        return self.max_requests * self.k_max * self._model.top_k

    def hierarchy_config(self) -> HierarchyConfig:
        p = self._policy
        return HierarchyConfig(
            num_pages=self.num_pages, page_rows=self.page_rows, hot_slots=self.hot_cache,
            tail_rows=self.tail_rows, reserve_pages=self.reserve_pages,
            staging_rows=self.staging_rows, max_requests=self.max_requests,
            policy="resident" if p.resident else ("adaptive" if p.optional else "hisparse"),
            device=self.device)

    def source_specs(self) -> list[SourceSpec]:
        m = self._model
        return [SourceSpec(f"g{g}", m.row_bytes, m.payloads_per_group) for g in range(m.groups)]
