"""The drafter: the target's first layers (shared weights) over a bounded window W.

Each draft layer ``l`` attends densely over its latent rows of positions
``max(base, t − W + 1) .. t`` kept in a ``DraftRing`` (one ring per draft layer, the
paper's per-layer K/V allocations), then the shared final norm and LM head give the draft
distribution ``q``. A round for a request whose anchor sits at position ``n``:

1. catch up: feed the committed tokens from the ring frontier to ``n − 1`` and the anchor
   at ``n`` (after a long prompt, start at ``n − layers·(W − 1)``: the state reached is
   exactly that of feeding everything, since nothing older reaches the window);
2. propose ``x_1 .. x_{K_r−1}``: ``fixed`` (DFlash2-like) proposes up to ``max_queries − 1``
   tokens; ``confidence`` (DSpark-like) stops before a token whose draft max-probability
   falls below ``threshold`` (so ``K_r`` varies per request and round, ``1 <= K_r``);
3. after verification the engine calls ``rollback(slot, n')``: a pointer move.

Every per-row and per-position stage is batch-invariant in the model's invariant mode.
Outside it (``batch_invariant=False``) ``_feed`` takes the vectorized path of
``fast_draft.feed_batched`` (one window gather and one batched attention per layer for
all positions of all requests), equal to the per-position reference up to rounding;
``Drafter.vectorized = False`` forces the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.common.errors import InvalidArgument
from services.decode.model.model import DSAModel
from services.decode.model.ops import attend, mlp, rms_norm, rowwise
from services.decode.spec.acceptance import sample_from
from services.decode.spec.fast_draft import feed_batched
from services.decode.spec.ring import DraftRing

MODES = ("fixed", "confidence")


@dataclass(slots=True)
class DrafterConfig:
    layers: int = 1
    window: int = 16
    page: int = 16
    k_max: int = 4
    mode: str = "fixed"
    threshold: float = 0.3
    greedy: bool = True

    def __post_init__(self) -> None:
        for name in ("layers", "window", "page", "k_max"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InvalidArgument(f"{name}={v!r} must be an integer >= 1")
        if self.mode not in MODES:
            raise InvalidArgument(f"mode={self.mode!r} must be one of {', '.join(MODES)}")
        if not 0.0 <= self.threshold <= 1.0:
            raise InvalidArgument(f"threshold={self.threshold} must be in [0, 1]")


@dataclass(slots=True)
class Proposal:
    """``tokens int64 [B, K_max]`` (col 0 anchor, padding 0), ``num_queries [B]`` (K_r),
    ``probs [B, K_max − 1, V]``: the draft distribution each proposal was drawn from."""

    tokens: torch.Tensor
    num_queries: torch.Tensor
    probs: torch.Tensor


class Drafter:
    def __init__(self, model: DSAModel, cfg: DrafterConfig, slots: int,
                 vectorized: bool = True) -> None:
        """``vectorized``: use ``feed_batched`` when the model is not batch-invariant
        (in batch-invariant mode the per-position reference always runs)."""
        if cfg.layers > model.cfg.layers:
            raise InvalidArgument(f"layers={cfg.layers} must be <= target "
                                  f"layers={model.cfg.layers}")
        self.model, self.cfg, self.vectorized = model, cfg, vectorized
        mc = model.cfg
        self.rings = [DraftRing(slots, cfg.window, cfg.page, cfg.k_max, (mc.latent_dim,),
                                mc.torch_dtype, mc.device) for _ in range(cfg.layers)]
        self.chunk = self.rings[0].rows_per_slot - cfg.window

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.rings)

    def frontier(self, slot: int) -> int:
        return self.rings[0].frontier(slot)

    def reset(self, slot: int) -> None:
        for r in self.rings:
            r.reset(slot)

    def rollback(self, slot: int, n: int) -> None:
        """Keep draft state of positions ``< n`` (``n'`` of eq. 7)."""
        for r in self.rings:
            r.rollback(slot, n)

    def _feed(self, items: list[tuple[int, int, torch.Tensor]]) -> torch.Tensor:
        """``items``: (slot, start, tokens [c]) with ``start <= frontier``; writes the rows
        of positions ``start .. start+c-1``; returns logits ``[len(items), V]`` of each
        item's last position."""
        mc, inv = self.model.cfg, self.model.cfg.batch_invariant
        if self.vectorized and not inv:
            return feed_batched(self.model, self.rings, items)
        w = self.model.w
        slot = [s for s, _, t in items for _ in range(t.shape[0])]
        pos = [a + i for _, a, t in items for i in range(t.shape[0])]
        h = w.embed[torch.cat([t for _, _, t in items])]
        for layer, ring in enumerate(self.rings):
            lw = w.layers[layer]
            x = rowwise(lambda r, lw=lw: rms_norm(r, lw.attn_norm), h, inv)
            c = rowwise(lambda r, lw=lw: r @ lw.wkv, x, inv)
            q = rowwise(lambda r, lw=lw: r @ lw.wq, x, inv).view(-1, mc.heads, mc.latent_dim)
            off = 0
            for s, a, t in items:
                ring.write(s, a, c[off: off + t.shape[0]])
                off += t.shape[0]
            o = torch.stack([
                attend(q[i].clone(), ring.read(slot[i], torch.tensor(
                    ring.window_positions(slot[i], pos[i]), device=h.device)))
                for i in range(len(pos))])
            h = h + rowwise(lambda r, lw=lw: r @ lw.wo, o, inv)
            h = h + rowwise(lambda r, lw=lw: mlp(r, lw.mlp_norm, lw.w_up, lw.w_down), h, inv)
        ends = torch.tensor([0] + [t.shape[0] for _, _, t in items]).cumsum(0)[1:] - 1
        return rowwise(lambda r: rms_norm(r, w.final_norm) @ w.lm_head, h[ends], inv)

    def _catch_up(self, slots: Sequence[int], histories: Sequence[torch.Tensor]):
        """Feed each request up to its anchor; returns draft logits after it ``[B, V]``.
        Every request's pending positions go through one ``_feed`` per ring chunk
        (``R_d − W`` positions): one call in the common case, whatever the gaps."""
        span = self.cfg.layers * (self.cfg.window - 1)
        starts, stops = [], []
        for s, hist in zip(slots, histories, strict=True):
            n, f = int(hist.shape[0]) - 1, self.frontier(s)
            if n < f:
                raise InvalidArgument(f"history of slot {s} (anchor at {n}) is behind the "
                                      f"drafter frontier={f}; roll back first")
            if n - span > f:  # too far behind: restart near the anchor
                for r in self.rings:
                    r.reset(s, n - span)
                f = n - span
            starts.append(f)
            stops.append(n + 1)
        last: list[torch.Tensor | None] = [None] * len(slots)
        while True:
            todo = [(b, a, min(a + self.chunk, e))
                    for b, (a, e) in enumerate(zip(starts, stops, strict=True)) if a < e]
            if not todo:
                return torch.stack(last)
            logits = self._feed([(slots[b], a, histories[b][a: e]) for b, a, e in todo])
            for (b, _, e), lg in zip(todo, logits, strict=True):
                starts[b], last[b] = e, lg

    def propose(self, slots: Sequence[int], histories: Sequence[torch.Tensor],
                max_queries: Sequence[int] | None = None,
                generators: Sequence[torch.Generator] | None = None) -> Proposal:
        """Propose a block per request. ``histories[b] int64 [n_b + 1]``: committed tokens
        then the anchor; ``max_queries[b] <= k_max`` caps ``K_r`` (default ``k_max``);
        ``generators`` (one per request) are required unless ``cfg.greedy``."""
        B, K, V = len(slots), self.cfg.k_max, self.model.cfg.vocab
        caps = list(max_queries) if max_queries is not None else [K] * B
        if any(not 1 <= c <= K for c in caps):
            raise InvalidArgument(f"max_queries={caps} must be in 1..k_max={K}")
        if not self.cfg.greedy and (generators is None or len(generators) != B):
            raise InvalidArgument(f"generators must be given, one per request (B={B})")
        dev = self.model.cfg.device
        tokens = torch.zeros(B, K, dtype=torch.int64, device=dev)
        probs = torch.zeros(B, K - 1, V, dtype=torch.float32, device=dev)
        kr = [1] * B
        tokens[:, 0] = torch.stack([hist[-1] for hist in histories])
        logits = self._catch_up(slots, histories)
        active = list(range(B))
        for j in range(1, K):
            p = torch.softmax(logits.float(), dim=-1)
            # one host read per step (not one per request): max / first argmax per row
            conf = p.amax(-1).tolist() if self.cfg.mode == "confidence" else None
            best = p.argmax(-1).tolist() if self.cfg.greedy else None
            rows, nxt, toks = [], [], []
            for i, b in enumerate(active):
                if kr[b] >= caps[b] or (conf is not None and conf[i] < self.cfg.threshold):
                    continue
                tok = (best[i] if best is not None else
                       int(sample_from(p[i: i + 1], torch.rand(1, generator=generators[b]))))
                rows.append(i)
                nxt.append(b)
                toks.append(tok)
                kr[b] = j + 1
            if nxt:
                picked = torch.tensor(nxt, device=dev)
                tokens[picked, j] = torch.tensor(toks, dtype=torch.int64, device=dev)
                probs[picked, j - 1] = p[torch.tensor(rows, device=dev)]
            active = [b for b in nxt if kr[b] < caps[b]]
            if not active:
                break
            logits = self._feed([(slots[b], self.frontier(slots[b]), tokens[b, j: j + 1])
                                 for b in active])
        return Proposal(tokens, torch.tensor(kr, device=dev), probs)
