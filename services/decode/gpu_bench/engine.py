"""``GpuEngine``: the decode engine as the GPU benchmark runs it.

Differences from a plain ``Engine`` (none changes what is computed):

* the model is a ``FastDSAModel`` over one shared set of device weights (``Shared``),
  so a sweep draws 2.4B parameters once, not once per engine;
* ``register_prefix`` imports a synthetic prefix (``synthetic_prefix``) generated once per
  (prefix id, length) and shared by every engine: no 32K-token prefill; each request still
  gets independent decode KV (the hierarchy copies the prefix rows at admission);
* host backing is pinned, and on CUDA the resolver is ``kernels.resolver`` (zero-copy
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
from services.decode.hierarchy.staging import release_staging
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


class FusedHierarchyKV(HierarchyKV):
    """``HierarchyKV`` with ``kernels.resolver``'s drop-in ``resolve``/``apply_copies``."""

    def __init__(self, hierarchy, groups: int) -> None:
        super().__init__(hierarchy, groups)
        from kernels import resolver as fused

        self._fused = fused

    def resolve(self, group, slots, selections, bounds):
        for earlier in [e for e in self._plans if e != group]:
            self._finish_group(earlier)
        g = self.h.group(self.names[group])
        rids = [self.request_of[int(s)] for s in slots.tolist()]
        opened = torch.tensor([g.request(r).tail_hi for r in rids], dtype=torch.int64,
                              device=bounds.device)
        visible = torch.minimum(bounds, opened.view(-1, 1)).contiguous()
        plan = self._fused.resolve(g, rids, selections.contiguous(), visible)
        self.counts.add(plan.counts)
        self._plans[group] = (plan, set(range(g.spec.payload_layers)))
        return plan.locations

    def pool(self, group, payload):
        g = self.h.group(self.names[group])
        pending = self._plans.get(group)
        if pending is not None and payload in pending[1]:
            self.copied_bytes += self._fused.apply_copies(g, pending[0], payload)
            pending[1].discard(payload)
        return g.payload(payload)

    def _finish_group(self, group):
        plan, layers = self._plans.pop(group)
        g = self.h.group(self.names[group])
        for layer in sorted(layers):
            self.copied_bytes += self._fused.apply_copies(g, plan, layer)
        g.readers_finished(plan.epoch)
        release_staging(g)


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
        if self.fused:
            self.kv = FusedHierarchyKV(self.hierarchy, config.model.groups)
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
