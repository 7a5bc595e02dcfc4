"""Vectorized forward for large configurations (the GPU benchmark's model path).

``FastDSAModel.forward`` computes the reference model's function (model.py) with one
batched operation per stage instead of Python loops over queries::

    reference (per query i)                      fast (whole round at once)
    keys = decode(index.keys(slot, g, t))        K = gather encoded keys [B, T, 132]
    s = w · relu(q_h · keys)            t        S = Σ_h w_h relu(Q_h Kᵀ) · scale   [B, K, T]
    top = stable_sort(s)[:min(k, t)]             stable sort of S, masked ≥ bound → -inf
    rows = decode(pool[loc_i] ‖ own_i)           one gather pool[loc] ‖ own, decoded once
    attend(q_i, rows)                            per group (shared by its layers), one
                                                 masked bmm → softmax → bmm per layer

Same tie rule (score descending, position ascending), same causal visibility (query j
of request b selects among positions < n_b + j and adds its own row), same byte codecs.
It is *not* batch-invariant: the batched matmuls, the padded key length T = max_b(n_b +
K_b) and the fp8 index scoring (fp8 values → bf16 matmul, the per-key scale applied to
the relu output: Σ w relu(q·k·s) = s · Σ w relu(q·k) for s > 0) round differently from
the reference, so logits agree to within rounding, not bitwise.

Exactness across policies still holds at a fixed batch composition: the policy only
changes *where* a selected row lives (pool location), never its bytes, the order of the
selection or any tensor shape, so every operation sees identical operands.

``DenseIndexState`` keeps every slot's keys in one preallocated device tensor so the
indexer gathers a batch's keys with one ``index_select``.
"""

from __future__ import annotations

import torch
from torch.profiler import record_function

from services.common.errors import InvalidArgument, NotFound, ResourceExhausted
from services.decode.model.codec import FP8, decode_rows, encode_keys, encode_rows
from services.decode.model.config import ModelConfig
from services.decode.model.index_state import IndexState
from services.decode.model.kv import KVAccess
from services.decode.model.model import DSAModel, Prefix, _Flat, round_shape
from services.decode.model.ops import mlp, rms_norm
from services.decode.model.weights import IndexerWeights, LayerWeights, Weights

NEG = float("-inf")


class DenseIndexState(IndexState):
    """``IndexState`` over one tensor ``uint8 [slots, groups, max_positions, key_bytes]``.

    Same contract as ``IndexState`` (open/write/keys/truncate/close/...); positions beyond
    ``max_positions`` raise ``ResourceExhausted``. ``gather`` returns a batch's keys.
    """

    def __init__(self, groups: int, key_bytes: int, slots: int, max_positions: int,
                 device: str | torch.device = "cpu") -> None:
        super().__init__(groups, key_bytes, device)
        if slots < 1 or max_positions < 1:
            raise InvalidArgument(f"slots={slots}, max_positions={max_positions} must be >= 1")
        self.slots, self.max_positions = slots, max_positions
        self.store = torch.zeros(slots, groups, max_positions, key_bytes, dtype=torch.uint8,
                                 device=self.device)
        self._lens: dict[int, list[int]] = {}

    def _require(self, slot: int) -> None:
        if slot not in self._lens:
            raise NotFound(f"slot={slot} has no index state (open it first)")

    def open(self, slot: int) -> None:
        if not 0 <= slot < self.slots:
            raise InvalidArgument(f"slot={slot} must be in 0..{self.slots - 1}")
        self._lens[slot] = [0] * self.groups

    def close(self, slot: int) -> None:
        self._require(slot)
        del self._lens[slot]

    def length(self, slot: int, group: int = 0) -> int:
        self._require(slot)
        return self._lens[slot][group]

    def write(self, slot: int, group: int, start: int, keys: torch.Tensor) -> None:
        self._require(slot)
        if start > self._lens[slot][group]:
            raise InvalidArgument(f"start={start} leaves a gap after "
                                  f"length={self._lens[slot][group]}")
        stop = start + keys.shape[0]
        if stop > self.max_positions:
            raise ResourceExhausted(f"position={stop - 1} exceeds "
                                    f"max_positions={self.max_positions}")
        self.store[slot, group, start:stop] = keys
        self._lens[slot][group] = stop

    def write_batch(self, group: int, slots: torch.Tensor, positions: torch.Tensor,
                    keys: torch.Tensor, starts: dict[int, int], stops: dict[int, int]) -> None:
        """One scatter for a round: ``keys [N, key_bytes]`` at ``(slots, positions)``;
        ``starts``/``stops`` per slot (host ints) keep the gap check and the lengths."""
        for slot, start in starts.items():
            self._require(slot)
            if start > self._lens[slot][group]:
                raise InvalidArgument(f"start={start} leaves a gap after "
                                      f"length={self._lens[slot][group]}")
            if stops[slot] > self.max_positions:
                raise ResourceExhausted(f"position={stops[slot] - 1} exceeds "
                                        f"max_positions={self.max_positions}")
        self.store[slots, group, positions] = keys
        for slot, stop in stops.items():
            self._lens[slot][group] = stop

    def keys(self, slot: int, group: int, stop: int) -> torch.Tensor:
        self._require(slot)
        if stop > self._lens[slot][group]:
            raise InvalidArgument(f"stop={stop} exceeds length={self._lens[slot][group]}")
        return self.store[slot, group, :stop]

    def gather(self, slots: torch.Tensor, group: int, stop: int) -> torch.Tensor:
        """``uint8 [B, stop, key_bytes]``: positions ``0 .. stop-1`` of each slot (rows past
        a slot's length are stale bytes; the caller masks them by position)."""
        return self.store[:, group, :stop].index_select(0, slots)

    def truncate(self, slot: int, n: int) -> None:
        self._require(slot)
        self._lens[slot] = [min(length, n) for length in self._lens[slot]]

    def nbytes(self, slot: int) -> int:
        self._require(slot)
        return sum(self._lens[slot]) * self.key_bytes


class FastDSAModel(DSAModel):
    """``DSAModel`` with the vectorized forward. ``slots``/``max_positions`` size the
    ``DenseIndexState`` that ``new_index_state`` returns (the engine's request slots and
    context limit)."""

    def __init__(self, cfg: ModelConfig, weights: Weights | None = None, slots: int = 1,
                 max_positions: int = 4096) -> None:
        super().__init__(cfg, weights)
        self.slots, self.max_positions = slots, max_positions

    def new_index_state(self) -> DenseIndexState:
        cfg = self.cfg
        return DenseIndexState(cfg.groups, cfg.index_key_bytes, self.slots,
                               self.max_positions, cfg.device)

    def forward(self, tokens: torch.Tensor, n_committed: torch.Tensor,
                num_queries: torch.Tensor, slots: torch.Tensor, kv: KVAccess,
                index: IndexState) -> torch.Tensor:
        """Same contract as ``DSAModel.forward`` (logits ``[B, K, V]``, zeros at padding)."""
        f, host = self._flatten_host(tokens, n_committed, num_queries, slots)
        cfg = self.cfg
        B, K = tokens.shape
        bounds = n_committed.view(-1, 1) + torch.arange(K, device=tokens.device)
        valid = torch.arange(K, device=tokens.device) < num_queries.view(-1, 1)
        h = self.w.embed[tokens[f.b, f.j]]
        for g in range(cfg.groups):
            rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
            loc = torch.empty(0)
            for m in range(cfg.group_size):
                layer = g * cfg.group_size + m
                lw = self.w.layers[layer]
                x = rms_norm(h, lw.attn_norm)
                if m == 0:
                    with record_function("indexer"):
                        sel = self._select_fast(g, x, f, host, bounds, valid, index)
                if cfg.produces_payload(layer):
                    with record_function("kv_write"):
                        kv.write_tail(g, cfg.payload_of(layer)[1], f.slot, f.pos,
                                      encode_rows(cfg, x @ lw.wkv))
                if m == 0:
                    with record_function("resolver"):
                        loc = kv.resolve(g, slots, sel, bounds)
                p = cfg.payload_of(layer)[1]
                if p not in rows:  # one gather + decode per payload source and round
                    with record_function("gather_rows"):
                        rows[p] = self._gather_rows(g, p, loc, f, kv)
                h = self._layer(lw, h, x, *rows[p])
        with record_function("lm_head"):
            logits = rms_norm(h, self.w.final_norm) @ self.w.lm_head
        out = torch.zeros(B, K, cfg.vocab, dtype=logits.dtype, device=logits.device)
        out[f.b, f.j] = logits
        return out

    def _flatten_host(self, tokens: torch.Tensor, n_committed: torch.Tensor,
                      num_queries: torch.Tensor, slots: torch.Tensor) -> tuple[_Flat, _HostView]:
        """``DSAModel._flatten`` (same checks, same errors, same ``_Flat``) and the round's
        host view from ONE device→host read: query counts, committed rows, slots and the
        three validity flags; the flat query indices go back with one copy."""
        B, K = round_shape(tokens, n_committed, num_queries, slots)
        valid = torch.arange(K, device=tokens.device) < num_queries.view(-1, 1)
        flags = torch.stack([((num_queries < 1) | (num_queries > K)).any(),
                             (n_committed < 0).any(),
                             (((tokens < 0) | (tokens >= self.cfg.vocab)) & valid).any()])
        read = torch.cat([num_queries.long(), n_committed.long(), slots.long(),
                          flags.long()]).tolist()
        nq, n, slot = read[:B], read[B: 2 * B], read[2 * B: 3 * B]
        bad_nq, bad_n, bad_tokens = read[3 * B:]
        if bad_nq:
            raise InvalidArgument(f"num_queries={nq} must be in 1..{K}")
        if bad_n:
            raise InvalidArgument(f"n_committed={n} must be >= 0")
        if bad_tokens:
            raise InvalidArgument(f"tokens must be in 0..{self.cfg.vocab - 1}")
        b_h = [b for b in range(B) for _ in range(nq[b])]
        j_h = [j for b in range(B) for j in range(nq[b])]
        bj = _device_ints([b_h, j_h], tokens.device)
        b, j = bj[0], bj[1]
        f = _Flat(b, j, slots[b], n_committed[b] + j)
        host = _HostView(b_h, [slot[bi] for bi in b_h],
                         [n[bi] + ji for bi, ji in zip(b_h, j_h, strict=True)], slots)
        return f, host

    def _layer(self, lw: LayerWeights, h: torch.Tensor, x: torch.Tensor,
               rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        with record_function("attention"):
            q = (x @ lw.wq).view(-1, cfg.heads, cfg.latent_dim)
            h = h + attend_batched(q, rows, mask) @ lw.wo
        with record_function("mlp"):
            return h + mlp(h, lw.mlp_norm, lw.w_up, lw.w_down)

    # -- indexer -------------------------------------------------------------------------
    def _select_fast(self, g: int, x: torch.Tensor, f, host: _HostView, bounds: torch.Tensor,
                     valid: torch.Tensor, index: IndexState) -> torch.Tensor:
        """Write the round's index keys, score every visible position of every query in
        one batched pass, stable top-k → ``selections int64 [B, K, k]`` (-1 = padding)."""
        cfg, iw = self.cfg, self.w.indexers[g]
        keys_new = encode_keys(cfg, x @ iw.wk)
        _write_keys(index, g, f, host, keys_new)
        T = host.key_stop
        if isinstance(index, DenseIndexState):
            enc = index.gather(host.slots_t, g, T)
        else:
            enc = torch.stack([_pad(index.keys(s, g, index.length(s, g)), T)
                               for s in host.slots])
        B, K = bounds.shape
        qi = torch.zeros(B, K, cfg.index_heads, cfg.index_dim, dtype=x.dtype, device=x.device)
        qi[f.b, f.j] = (x @ iw.wq).view(-1, cfg.index_heads, cfg.index_dim)
        wi = torch.zeros(B, K, cfg.index_heads, dtype=x.dtype, device=x.device)
        wi[f.b, f.j] = x @ iw.ww
        scores = index_scores_batched(cfg, enc, qi, wi)  # [B, K, T] fp32
        pos = torch.arange(T, device=x.device)
        visible = (pos.view(1, 1, -1) < bounds.unsqueeze(-1)) & valid.unsqueeze(-1)
        return select_topk_batched(scores.masked_fill(~visible, NEG), cfg.top_k)

    # -- attention -----------------------------------------------------------------------
    def _gather_rows(self, g: int, p: int, loc: torch.Tensor, f, kv: KVAccess):
        """Decoded rows every valid query attends over: its selected rows then its own row
        → ``rows [N, k+1, latent]`` and ``mask bool [N, k+1]`` (True = attended)."""
        cfg = self.cfg
        sel = loc[f.b, f.j]  # [N, k]
        with record_function("host_copies"):
            pool = kv.pool(g, p)  # applies the plan's host copies to this payload
        own = kv.tail_rows(g, p, f.slot, f.pos)
        raw = torch.cat([pool[sel.clamp_min(0)], own.unsqueeze(1)], dim=1)  # [N, k+1, R]
        mask = torch.cat([sel >= 0, torch.ones_like(sel[:, :1], dtype=torch.bool)], dim=1)
        rows = decode_rows(cfg, raw).masked_fill(~mask.unsqueeze(-1), 0)
        return rows, mask


class _HostView:
    """Host-side facts of a round (one device→host read): slots, first/last position."""

    def __init__(self, b: list[int], slot: list[int], pos: list[int],
                 slots: torch.Tensor) -> None:
        """``b``/``slot``/``pos`` per valid query (b-major, every request has one);
        ``slots`` the round's slot tensor (its order is the requests' order)."""
        self.start: dict[int, int] = {}
        self.stop: dict[int, int] = {}
        order: list[int] = []
        for bi, s, t in zip(b, slot, pos, strict=True):
            if bi not in self.start:
                self.start[bi] = t
                order.append(s)
            self.stop[bi] = t + 1
        self.slot_of = {bi: s for bi, s in zip(b, slot, strict=True)}
        self.slots = order
        self.slots_t = slots  # every request has ≥ 1 query: order == slots, b-major
        self.key_stop = max(self.stop.values())


def _device_ints(values: list[list[int]], device: torch.device) -> torch.Tensor:
    """Host ints → ``int64`` on ``device`` (pinned, non-blocking on CUDA: no wait)."""
    t = torch.tensor(values, dtype=torch.int64)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _write_keys(index: IndexState, g: int, f, host: _HostView, keys: torch.Tensor) -> None:
    if isinstance(index, DenseIndexState):
        starts = {host.slot_of[b]: t for b, t in host.start.items()}
        stops = {host.slot_of[b]: t for b, t in host.stop.items()}
        index.write_batch(g, f.slot, f.pos, keys, starts, stops)
        return
    i = 0
    for b, start in host.start.items():
        n = host.stop[b] - start
        index.write(host.slot_of[b], g, start, keys[i: i + n])
        i += n


def _pad(keys: torch.Tensor, T: int) -> torch.Tensor:
    out = torch.zeros(T, keys.shape[1], dtype=keys.dtype, device=keys.device)
    out[: keys.shape[0]] = keys
    return out


def index_scores_batched(cfg: ModelConfig, enc: torch.Tensor, q: torch.Tensor,
                         w: torch.Tensor) -> torch.Tensor:
    """Lightning-indexer scores of every query over its request's keys.

    ``enc uint8 [B, T, key_bytes]`` (encoded keys), ``q [B, K, H, d]``, ``w [B, K, H]``
    → ``float32 [B, K, T]`` = Σ_h w_h · relu(q_h · k_t) (fp8 keys: · scale_t, see module).
    """
    B, K, H, d = q.shape
    if cfg.index_format == "fp8":
        vals = enc[..., :d].view(FP8).to(q.dtype)  # exact: e4m3 ⊂ bf16
        scale = enc[..., d:d + 4].view(torch.float32).squeeze(-1)  # [B, T]
    else:
        vals, scale = enc.view(cfg.torch_dtype), None
    logits = torch.bmm(q.reshape(B, K * H, d), vals.transpose(1, 2))  # [B, K·H, T]
    act = torch.relu(logits).float().view(B, K, H, -1)
    s = torch.einsum("bkh,bkht->bkt", w.float(), act)
    return s if scale is None else s * scale.unsqueeze(1)


def select_topk_batched(scores: torch.Tensor, k: int) -> torch.Tensor:
    """``scores [..., T]`` (-inf = not visible) → top-``k`` positions ``int64 [..., k]``
    ordered by (score desc, position asc); -1 where fewer than ``k`` are visible."""
    T = scores.shape[-1]
    vals, idx = torch.sort(scores, dim=-1, descending=True, stable=True)
    if T < k:
        pad = [0, k - T]
        vals = torch.nn.functional.pad(vals, pad, value=NEG)
        idx = torch.nn.functional.pad(idx, pad, value=-1)
    vals, idx = vals[..., :k], idx[..., :k]
    return torch.where(vals == NEG, torch.full_like(idx, -1), idx)


def attend_batched(q: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``q [N, H, D]``, ``rows [N, n, D]``, ``mask bool [N, n]`` → ``[N, H·D]`` (MLA-like,
    K = V = latent; masked rows get probability 0)."""
    s = torch.bmm(q, rows.transpose(1, 2)).float() * rows.shape[-1] ** -0.5  # [N, H, n]
    s = s.masked_fill(~mask.unsqueeze(1), NEG)
    p = torch.softmax(s, dim=-1).to(rows.dtype)
    return torch.bmm(p, rows).flatten(1)


# -- weights and prefixes for the benchmark (no prefill) -------------------------------------
def device_weights(cfg: ModelConfig) -> Weights:
    """Random weights drawn on ``cfg.device`` (seeded; same distribution as
    ``init_weights``, not the same values): a 2.4B-parameter preset in about a second
    on a GPU instead of minutes of CPU sampling."""
    gen = torch.Generator(device=cfg.device).manual_seed(cfg.seed)
    dev, dt = cfg.device, cfg.torch_dtype

    def proj(n_in: int, n_out: int, scale: float = 1.0) -> torch.Tensor:
        w = torch.randn(n_in, n_out, generator=gen, device=dev, dtype=torch.float32)
        return (w * (scale / n_in**0.5)).to(dt)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, device=dev, dtype=dt)

    w, hd, rs = cfg.width, cfg.heads * cfg.latent_dim, cfg.residual_scale
    embed = torch.randn(cfg.vocab, w, generator=gen, device=dev).to(dt)
    layers = [LayerWeights(ones(w), proj(w, hd), proj(w, cfg.latent_dim), proj(hd, w, rs),
                           ones(w), proj(w, cfg.mlp_width), proj(cfg.mlp_width, w, rs))
              for _ in range(cfg.layers)]
    indexers = [IndexerWeights(proj(w, cfg.index_heads * cfg.index_dim), proj(w, cfg.index_dim),
                               proj(w, cfg.index_heads)) for _ in range(cfg.groups)]
    return Weights(embed, layers, indexers, ones(w), proj(w, cfg.vocab))


def synthetic_prefix(cfg: ModelConfig, tokens: torch.Tensor, seed: int) -> Prefix:
    """A prepared prefix without prefill: rows and keys are encodings of random latent /
    key vectors (valid fp8 layouts, never NaN), ``next_logits`` random. Stands in for a
    computed prompt wherever only the bytes per token and the selection workload matter."""
    dev = cfg.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    T = int(tokens.shape[0])
    rows = {(g, p): encode_rows(cfg, torch.randn(T, cfg.latent_dim, generator=gen, device=dev))
            for g in range(cfg.groups) for p in range(cfg.payloads_per_group)}
    keys = [encode_keys(cfg, torch.randn(T, cfg.index_dim, generator=gen, device=dev))
            for _ in range(cfg.groups)]
    logits = torch.randn(cfg.vocab, generator=gen, device=dev)
    return Prefix(tokens.to(dev), rows, keys, logits)
