"""Vectorized ``Drafter._feed`` for the non-batch-invariant mode.

The reference feed attends position by position (one ring read, with a host-side
liveness check, and one small attention per position and layer). Here every position of
every item is handled at once, per draft layer:

1. one indexed write of all items' latent rows into the layer's ring (the rows of an
   item's positions ``start .. start+c−1``, as ``DraftRing.write`` would store them);
2. one gather of each position's window ``[t − W + 1, t]`` of ring rows, padded on the
   left to ``W`` with a mask (positions below the slot's ``base``);
3. one batched masked-softmax attention, then the output projection and MLP as batched
   matmuls.

All writes of a layer precede its reads, exactly as in the reference, so a position sees
the rows written by earlier positions of its own item in the same call (causal within the
chunk): a chunk holds at most ``R_d − W`` positions, so its writes never alias a row of
the window of any of its positions. The index tensors are built on the host from
Python ints and moved to the device once per call; nothing synchronizes per position.

The result equals the reference up to floating-point rounding (different reduction
shapes); it is not batch-invariant, so the drafter uses it only when the model's
``batch_invariant`` is False.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from services.common.errors import InvalidArgument
from services.decode.model.model import DSAModel
from services.decode.model.ops import mlp, rms_norm
from services.decode.spec.ring import DraftRing


def feed_batched(model: DSAModel, rings: Sequence[DraftRing],
                 items: Sequence[tuple[int, int, torch.Tensor]]) -> torch.Tensor:
    """``items``: (slot, start, tokens [c]) with ``start <= frontier``; writes the rows of
    positions ``start .. start+c−1`` in every ring; returns the logits ``[len(items), V]``
    of each item's last position (the reference ``Drafter._feed``, vectorized)."""
    mc, w = model.cfg, model.w
    dev = w.embed.device
    ring0 = rings[0]
    R, W = ring0.rows_per_slot, ring0.window
    slots = [s for s, _, _ in items]
    starts = [a for _, a, _ in items]
    counts = [int(t.shape[0]) for _, _, t in items]
    bases = [ring0.pointer_state(s)[2] for s in slots]
    # host-side index tensors: one row per fed position
    cnt = torch.tensor(counts, dtype=torch.int64)
    item_of = torch.repeat_interleave(torch.arange(len(items)), cnt)
    first = torch.cumsum(cnt, 0) - cnt  # offset of each item's first position
    N = int(item_of.shape[0])
    pos = torch.tensor(starts, dtype=torch.int64)[item_of] + torch.arange(N) - first[item_of]
    slot_of = torch.tensor(slots, dtype=torch.int64)[item_of]
    base_of = torch.tensor(bases, dtype=torch.int64)[item_of]
    wpos = pos[:, None] + torch.arange(-(W - 1), 1)  # [N, W] ascending, last = t
    valid = wpos >= base_of[:, None]
    wpos = torch.where(valid, wpos, pos[:, None])  # padding reads the position's own row
    read_addr = slot_of[:, None] * R + wpos % R
    write_addr = slot_of * R + pos % R
    read_addr, write_addr, valid = (read_addr.to(dev), write_addr.to(dev),
                                    valid.to(dev))
    neg = ~valid[:, None, :]  # [N, 1, W]
    distinct = len(set(slots)) == len(slots)

    h = w.embed[torch.cat([t for _, _, t in items])]
    scale = mc.latent_dim ** -0.5
    for layer, ring in enumerate(rings):
        lw = w.layers[layer]
        x = rms_norm(h, lw.attn_norm)
        c = x @ lw.wkv  # [N, D]
        q = (x @ lw.wq).view(-1, mc.heads, mc.latent_dim)  # [N, H, D]
        if distinct:
            ring.write_many(slots, starts, counts, write_addr, c)
        else:  # the same slot twice: sequential writes, later ones win (as the reference)
            off = 0
            for s, a, n in zip(slots, starts, counts, strict=True):
                ring.write(s, a, c[off: off + n])
                off += n
        if layer == 0:  # the reference's liveness check, once per item
            for sl, a, n, b in zip(slots, starts, counts, bases, strict=True):
                lo, live = max(b, a - W + 1), ring.live(sl)
                if lo < live.start or a + n > live.stop:
                    raise InvalidArgument(f"positions {lo}..{a + n - 1} must be live "
                                          f"({live.start}..{live.stop - 1})")
        rows = ring.storage[read_addr]  # [N, W, D]
        s = torch.bmm(q, rows.transpose(1, 2)).float() * scale  # [N, H, W]
        p = torch.softmax(s.masked_fill(neg, float("-inf")), dim=-1).to(rows.dtype)
        o = torch.bmm(p, rows).flatten(1)  # [N, H·D]
        h = h + o @ lw.wo
        h = h + mlp(h, lw.mlp_norm, lw.w_up, lw.w_down)
    ends = (first + cnt - 1).to(dev)
    return rms_norm(h[ends], w.final_norm) @ w.lm_head
