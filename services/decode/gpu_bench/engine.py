"""``GpuEngine``: the decode engine as the GPU benchmark runs it.

Differences from a plain ``Engine`` (none changes what is computed):

* the model is a ``FastDSAModel`` over one shared set of device weights (``Shared``),
  so a sweep draws 2.4B parameters once, not once per engine;
* ``register_prefix`` imports a synthetic prefix (``synthetic_prefix``) generated once per
  (prefix id, length) and shared by every engine: no 32K-token prefill; each request still
  gets independent decode KV (the hierarchy copies the prefix rows at admission);
* host backing is pinned, and on CUDA the resolver is ``kernels.dropin`` (zero-copy
  reads of pinned host rows) when ``fused`` — the caller decides from the kernel tests;
* profiler ranges around admission, commit/backup and the drafter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.profiler import record_function

from services.decode.engine.config import EngineConfig
from services.decode.engine.engine import Engine
from services.decode.engine.kv_adapter import HierarchyKV
from services.decode.hierarchy import InProcessBackingProvider
from services.decode.model.config import ModelConfig
from services.decode.model.fast import FastDSAModel, device_weights, synthetic_prefix
from services.decode.model.model import Prefix
from services.decode.model.weights import Weights, init_weights


@dataclass(slots=True)
class Shared:
    """What every engine of a sweep shares: weights and generated prefixes."""

    model: ModelConfig
    weights: Weights
    prefixes: dict[tuple[str, int], Prefix] = field(default_factory=dict)

    @classmethod
    def build(cls, model: ModelConfig) -> Shared:
        on_gpu = torch.device(model.device).type == "cuda"
        return cls(model, device_weights(model) if on_gpu else init_weights(model))

    def prefix(self, prefix_id: str, tokens: list[int]) -> Prefix:
        key = (prefix_id, len(tokens))
        if key not in self.prefixes:
            t = torch.tensor(tokens, dtype=torch.int64)
            self.prefixes[key] = synthetic_prefix(self.model, t, seed=1000 + len(self.prefixes))
        return self.prefixes[key]


class GpuEngine(Engine):
    def __init__(self, config: EngineConfig, shared: Shared, fused: bool = False) -> None:
        model = FastDSAModel(config.model, shared.weights, slots=config.max_requests,
                             max_positions=config.max_context)
        on_gpu = torch.device(config.device).type == "cuda"
        provider = (InProcessBackingProvider(pin=on_gpu) if config.policy_.uses_host
                    else None)
        super().__init__(config, provider=provider, model=model)
        self.shared = shared
        self.fused = fused and on_gpu
        # on CUDA the fused kernels unless the caller's kernel gate said no
        self.kv = HierarchyKV(self.hierarchy, config.model.groups, fused=self.fused)
        if self.drafter is not None:
            propose = self.drafter.propose

            def traced(*a, **kw):
                with record_function("drafter"):
                    return propose(*a, **kw)

            self.drafter.propose = traced

    def register_prefix(self, prefix_id: str, tokens: list[int]) -> Prefix:
        """Import the shared synthetic prefix for ``prefix_id`` (no prefill)."""
        prefix = self.shared.prefix(prefix_id, tokens)
        self.prefixes[prefix_id] = prefix
        return prefix

    def _run_commands(self) -> None:
        with record_function("admission+commands"):
            super()._run_commands()

    def _commit(self, run, n_new: int) -> None:
        with record_function("commit+backup"):
            super()._commit(run, n_new)
