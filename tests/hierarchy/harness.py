"""Test harness: a tiny source group plus the resident reference copy of every row."""

from __future__ import annotations

import dataclasses

import torch

from services.decode.hierarchy import (
    HierarchyConfig,
    InProcessBackingProvider,
    ResolvePlan,
    SourceGroup,
    SourceSpec,
    admit,
    apply_copies,
    open_rows,
    resolve,
)
from services.decode.hierarchy.invariants import assert_all, assert_exact


class Harness:
    """One source group on ``device``; ``truth[(rid, layer)]`` holds every original row."""

    def __init__(
        self,
        device: str = "cpu",
        policy: str = "adaptive",
        layers: int = 2,
        row_bytes: int = 8,
        seed: int = 0,
        **sizes: int,
    ) -> None:
        cfg = dict(num_pages=24, page_rows=4, hot_slots=3, tail_rows=7, reserve_pages=1,
                   staging_rows=12, max_requests=3)
        cfg.update(sizes)
        self.config = HierarchyConfig(policy=policy, device=device, **cfg)
        self.provider = InProcessBackingProvider()
        provider = self.provider if policy != "resident" else None
        self.group = SourceGroup(SourceSpec("g", row_bytes, layers), self.config, provider=provider)
        self.truth: dict[tuple[str, int], torch.Tensor] = {}
        self.gen = torch.Generator().manual_seed(seed)

    @property
    def layers(self) -> int:
        return self.group.spec.payload_layers

    def random_rows(self, n: int) -> torch.Tensor:
        shape = (n, self.group.spec.row_bytes)
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=self.gen)

    def admit(self, rid: str, max_rows: int, imported: int):
        rows = [self.random_rows(max_rows) for _ in range(self.layers)]
        state = admit(self.group, rid, max_rows, [r[:imported] for r in rows])
        for layer, r in enumerate(rows):  # only once admitted: a failure changes nothing
            self.truth[(rid, layer)] = r
        return state

    def open(self, rid: str, count: int) -> torch.Tensor:
        """Open ``count`` rows and write fresh bytes for them in every layer (like a forward)."""
        start = self.group.request(rid).tail_hi
        locs = open_rows(self.group, rid, count)
        for layer in range(self.layers):
            rows = self.random_rows(count)
            self.truth[(rid, layer)][start : start + count] = rows
            self.group.payload(layer)[locs] = rows.to(self.group.device)
        return locs

    def tensor(self, data) -> torch.Tensor:
        return torch.tensor(data, dtype=torch.int64, device=self.group.device)

    def resolve(self, rids, selections, visible=None, apply: bool = True) -> ResolvePlan:
        """Resolve (visible defaults to each query's eq. 5 bound), apply, check exactness."""
        sel = selections if isinstance(selections, torch.Tensor) else self.tensor(selections)
        if visible is None:
            visible = self.causal_bounds(rids, sel.shape[1])
        vis = visible if isinstance(visible, torch.Tensor) else self.tensor(visible)
        plan = resolve(self.group, list(rids), sel, vis)
        if apply:
            for layer in range(self.layers):
                apply_copies(self.group, plan, layer)
            assert_exact(self.group, self.truth, plan, sel)
        return plan

    def causal_bounds(self, rids, k_queries: int) -> torch.Tensor:
        """``visible[b, j] = min(n_r + j + 1, tail_hi_r)`` (eq. 5)."""
        rows = []
        for rid in rids:
            s = self.group.request(rid)
            rows.append([min(s.committed + j + 1, s.tail_hi) for j in range(k_queries)])
        return self.tensor(rows)

    def check(self) -> None:
        assert_all(self.group, self.truth)

    def hot_rows(self, rid: str) -> list[int]:
        return self.group.request(rid).hot_rows.tolist()

    def hot_locs(self, rid: str, slots: list[int]) -> list[int]:
        return self.group.request(rid).hot_locs[slots].tolist()


def distinct_hot(state) -> bool:
    """No row in two hot slots (invariant I4; tests that write hot_rows may break it)."""
    held = state.hot_rows[state.hot_rows >= 0]
    return held.unique().numel() == held.numel()


def snapshot(h: Harness) -> dict:
    """Everything a failed operation must leave unchanged (tensors copied to CPU)."""
    g = h.group
    out: dict = {
        "epochs": (g.clock, g.finished_epoch, g.pending_epoch, sorted(g.pending_layers)),
        "free": list(g.pages.free_ids),
        "kind": dict(g.pages.kind),
        "staging": (list(g.staging.free_locs), dict(g.staging.staged)),
        "counters": dataclasses.asdict(g.counters),
        "payloads": [p.cpu().clone() for p in g.payloads],
        "histories": {
            k: (b.rows().clone(), b.backed_mask().clone()) for k, b in h.provider.histories.items()
        },
    }
    for rid, s in g.requests.items():
        # hot_rank is the CUDA lookup's cache of hot_rows (a lookup may build it before a
        # round fails); the invariants check it wherever it is valid
        values = {f.name: getattr(s, f.name) for f in dataclasses.fields(s)
                  if f.name not in ("backings", "hot_rank")}
        out[rid] = {
            k: v.cpu().clone() if isinstance(v, torch.Tensor) else v for k, v in values.items()
        }
    return out


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys(), f"keys differ: {a.keys() ^ b.keys()}"
    for key in a:
        _equal(a[key], b[key], str(key))


def _equal(x, y, where: str) -> None:
    if isinstance(x, torch.Tensor):
        assert torch.equal(x, y), f"state changed at {where}"
    elif isinstance(x, dict):
        assert x.keys() == y.keys(), f"state changed at {where}"
        for k in x:
            _equal(x[k], y[k], f"{where}.{k}")
    elif isinstance(x, list | tuple):
        assert len(x) == len(y), f"state changed at {where}"
        for i, (u, v) in enumerate(zip(x, y, strict=True)):
            _equal(u, v, f"{where}[{i}]")
    else:
        assert x == y, f"state changed at {where}: {x!r} != {y!r}"
