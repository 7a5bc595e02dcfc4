"""The reference DSA-style model: embedding → groups of (indexer → top-k → sparse attention
over resolved rows + the query's own row → MLP) → LM head (DESIGN.md §7).

One ``forward`` serves decode (K = 1), speculative verification (K = K_max, per-request
``K_r``) and chunked prefill: query ``j`` of request ``b`` sits at ``n_b + j``, selects
top-``min(k, n_b + j)`` among the positions before it (committed history and the earlier
part of its block), and attends over those rows plus its own freshly written row (the
causal diagonal). Because a query's visible set and arithmetic depend only on its
position, a K-query round computes what K sequential steps compute — bit for bit in the
batch-invariant mode (``ModelConfig.batch_invariant``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.common.errors import InvalidArgument
from services.decode.model.codec import decode_keys, decode_rows, encode_keys, encode_rows
from services.decode.model.config import ModelConfig
from services.decode.model.index_state import IndexState
from services.decode.model.kv import DenseKV, KVAccess
from services.decode.model.ops import attend, index_scores, mlp, rms_norm, rowwise, select_topk
from services.decode.model.weights import Weights, init_weights


@dataclass(slots=True)
class Prefix:
    """A prepared prompt, importable into many requests.

    ``rows[(g, p)]``: ``uint8 [T, row_bytes]`` per payload source; ``keys[g]``:
    ``uint8 [T, index_key_bytes]`` per group; ``next_logits [V]``: logits after the last
    prompt token (their argmax / sample is the first anchor, at position T).
    """

    tokens: torch.Tensor
    rows: dict[tuple[int, int], torch.Tensor]
    keys: list[torch.Tensor]
    next_logits: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])


@dataclass(slots=True)
class _Flat:
    """The valid (non-padding) queries of a batch, b-major: ``[N]`` each."""

    b: torch.Tensor
    j: torch.Tensor
    slot: torch.Tensor
    pos: torch.Tensor


def round_shape(tokens: torch.Tensor, n_committed: torch.Tensor, num_queries: torch.Tensor,
                slots: torch.Tensor) -> tuple[int, int]:
    """``(B, K)`` of a round's ``tokens [B, K]``; InvalidArgument unless the per-request
    tensors are ``[B]`` (the shape checks of every model's forward)."""
    if tokens.dim() != 2:
        raise InvalidArgument(f"tokens.dim()={tokens.dim()} must be 2 ([B, K])")
    B, K = tokens.shape
    for name, t in (("n_committed", n_committed), ("num_queries", num_queries),
                    ("slots", slots)):
        if tuple(t.shape) != (B,):
            raise InvalidArgument(f"{name}.shape={tuple(t.shape)} must be ({B},)")
    return B, K


class DSAModel:
    def __init__(self, cfg: ModelConfig, weights: Weights | None = None) -> None:
        self.cfg = cfg
        self.w = weights if weights is not None else init_weights(cfg)

    def new_index_state(self) -> IndexState:
        return IndexState(self.cfg.groups, self.cfg.index_key_bytes, self.cfg.device)

    # -- forward ---------------------------------------------------------------------------
    def forward(self, tokens: torch.Tensor, n_committed: torch.Tensor,
                num_queries: torch.Tensor, slots: torch.Tensor, kv: KVAccess,
                index: IndexState) -> torch.Tensor:
        """Run one round; returns ``logits [B, K, V]`` (zeros at padding queries).

        ``tokens int64 [B, K]``: token of query j at position ``n_b + j`` (the anchor at
        j = 0, then drafts); ``n_committed int64 [B]``; ``num_queries int64 [B]`` with
        ``1 <= K_b <= K`` (queries ``>= K_b`` are padding: no compute, no rows);
        ``slots int64 [B]``: request slots of ``kv`` and ``index`` (must be open).
        Side effects: payload rows and index keys of positions ``n_b .. n_b+K_b-1``.
        """
        f = self._flatten(tokens, n_committed, num_queries, slots)
        cfg, inv = self.cfg, self.cfg.batch_invariant
        bounds = n_committed.view(-1, 1) + torch.arange(tokens.shape[1], device=tokens.device)
        h = self.w.embed[tokens[f.b, f.j]]
        for g in range(cfg.groups):
            loc = torch.empty(0)
            for m in range(cfg.group_size):
                layer = g * cfg.group_size + m
                lw = self.w.layers[layer]
                x = rowwise(lambda r, lw=lw: rms_norm(r, lw.attn_norm), h, inv)
                if m == 0:
                    sel = self._select(g, x, f, tokens.shape, index)
                if cfg.produces_payload(layer):
                    c = rowwise(lambda r, lw=lw: r @ lw.wkv, x, inv)
                    kv.write_tail(g, cfg.payload_of(layer)[1], f.slot, f.pos,
                                  encode_rows(cfg, c))
                if m == 0:
                    loc = kv.resolve(g, slots, sel, bounds)
                q = rowwise(lambda r, lw=lw: r @ lw.wq, x, inv)
                o = self._attend(layer, q, loc, f, kv)
                h = h + rowwise(lambda r, lw=lw: r @ lw.wo, o, inv)
                h = h + rowwise(lambda r, lw=lw: mlp(r, lw.mlp_norm, lw.w_up, lw.w_down),
                                h, inv)
        logits = rowwise(lambda r: rms_norm(r, self.w.final_norm) @ self.w.lm_head, h, inv)
        out = torch.zeros(*tokens.shape, cfg.vocab, dtype=logits.dtype, device=logits.device)
        out[f.b, f.j] = logits
        return out

    def _flatten(self, tokens, n_committed, num_queries, slots) -> _Flat:
        _, K = round_shape(tokens, n_committed, num_queries, slots)
        if bool(((num_queries < 1) | (num_queries > K)).any()):
            raise InvalidArgument(f"num_queries={num_queries.tolist()} must be in 1..{K}")
        if bool((n_committed < 0).any()):
            raise InvalidArgument(f"n_committed={n_committed.tolist()} must be >= 0")
        valid = torch.arange(K, device=tokens.device) < num_queries.view(-1, 1)
        if bool(((tokens < 0) | (tokens >= self.cfg.vocab))[valid].any()):
            raise InvalidArgument(f"tokens must be in 0..{self.cfg.vocab - 1}")
        b, j = valid.nonzero(as_tuple=True)
        return _Flat(b, j, slots[b], n_committed[b] + j)

    def _select(self, g: int, x: torch.Tensor, f: _Flat, shape, index: IndexState):
        """Write the block's index keys, then top-k per query → ``selections [B, K, k]``."""
        cfg, iw, inv = self.cfg, self.w.indexers[g], self.cfg.batch_invariant
        keys_new = encode_keys(cfg, rowwise(lambda r: r @ iw.wk, x, inv))
        qi = rowwise(lambda r: r @ iw.wq, x, inv).view(-1, cfg.index_heads, cfg.index_dim)
        wi = rowwise(lambda r: r @ iw.ww, x, inv)
        sel = torch.full((*shape, cfg.top_k), -1, dtype=torch.int64, device=x.device)
        for b in torch.unique_consecutive(f.b).tolist():
            rows = (f.b == b).nonzero().flatten()
            first, last = int(rows[0]), int(rows[-1])
            slot, n = int(f.slot[first]), int(f.pos[first])
            index.write(slot, g, n, keys_new[first: last + 1])
            keys = decode_keys(cfg, index.keys(slot, g, int(f.pos[last])))
            for i in range(first, last + 1):
                t = int(f.pos[i])
                if t == 0:
                    continue
                s = index_scores(keys[:t], qi[i].clone(), wi[i].clone())
                top = select_topk(s, cfg.top_k)
                sel[b, int(f.j[i]), : top.shape[0]] = top
        return sel

    def _attend(self, layer: int, q: torch.Tensor, loc: torch.Tensor, f: _Flat,
                kv: KVAccess) -> torch.Tensor:
        """Per query: decode its selected rows + own row, attend → ``[N, heads·latent]``."""
        cfg = self.cfg
        g, p = cfg.payload_of(layer)
        pool = kv.pool(g, p)
        own = kv.tail_rows(g, p, f.slot, f.pos)
        q = q.view(-1, cfg.heads, cfg.latent_dim)
        out = []
        for i in range(q.shape[0]):
            li = loc[f.b[i], f.j[i]]
            li = li[li >= 0]
            rows = decode_rows(cfg, torch.cat([pool[li], own[i: i + 1]]))
            out.append(attend(q[i].clone(), rows))
        return torch.stack(out)

    # -- prefill and prepared prefixes ------------------------------------------------------
    def prefill(self, tokens: torch.Tensor, chunk: int = 64) -> Prefix:
        """Run a prompt ``tokens int64 [T]`` (T >= 1) on private dense storage, ``chunk``
        positions per forward, and return its rows, keys and next-token logits."""
        T = int(tokens.shape[0]) if tokens.dim() == 1 else -1
        if T < 1:
            raise InvalidArgument(f"tokens.shape={tuple(tokens.shape)} must be [T], T >= 1")
        if chunk < 1:
            raise InvalidArgument(f"chunk={chunk} must be >= 1")
        kv = DenseKV.for_model(self.cfg, slots=1, max_positions=T)
        index = self.new_index_state()
        index.open(0)
        one = torch.ones(1, dtype=torch.int64, device=tokens.device)
        for a in range(0, T, chunk):
            part = tokens[a: a + chunk].view(1, -1)
            logits = self.forward(part, one * a, one * part.shape[1], one * 0, kv, index)
        return Prefix(tokens.clone(), kv.export_rows(0, T), index.export(0, T),
                      logits[0, -1].clone())

    def import_prefix(self, prefix: Prefix, slot: int, index: IndexState,
                      kv: DenseKV | None = None) -> None:
        """Give ``slot`` the prefix's index keys (and rows, when ``kv`` is a ``DenseKV``;
        a hierarchy imports ``prefix.rows`` itself). Positions ``0 .. T-1`` are committed."""
        index.import_keys(slot, prefix.keys)
        if kv is not None:
            kv.import_rows(slot, prefix.rows)
