"""Fused CUDA resolver against the hierarchy's torch resolver: plans and state bit-exact.

Two harnesses with the same seed hold identical groups on the GPU; one is driven by
``services.decode.hierarchy`` (reference), the other by ``kernels.dropin``. After every
call: same plan (locations, direct flags, copy list, counts), same state (hot-cache slot
table, LRU stamps, protection, staging arena, counters, payload bytes), and the
hierarchy invariants hold.
"""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest
import torch

from services.common.errors import FailedPrecondition
from services.decode import hierarchy as ref
from services.decode.hierarchy.invariants import assert_exact, assert_hot_rank
from tests.hierarchy.harness import Harness, assert_same, snapshot


def test_cpu_group_falls_back_to_the_reference() -> None:
    from kernels import dropin

    pair = [Harness("cpu", policy="hisparse", layers=1) for _ in range(2)]
    for h in pair:
        h.admit("a", 32, 16)
        h.open("a", 1)
    sel = pair[0].tensor([[[3, 5, 16, 3]]])
    plans = [
        ref.resolve(pair[0].group, ["a"], sel, pair[0].causal_bounds(["a"], 1)),
        dropin.resolve(pair[1].group, ["a"], sel, pair[1].causal_bounds(["a"], 1)),
    ]
    assert torch.equal(plans[0].locations, plans[1].locations)
    assert_same(snapshot(pair[0]), snapshot(pair[1]))


# -- GPU ------------------------------------------------------------------------------
def make_pair(
    seed: int, batch: int, k_queries: int, hot: int, staging: int, row_bytes: int, layers: int = 2,
    imported_range: tuple[int, int] = (1, 300), ref_device: str = "cuda",
) -> tuple[Harness, Harness, list[str]]:
    """Adaptive groups: every request's history (``imported_range`` rows) is admitted to
    optional pages, backed up, then a random ~70% of its pages retired, so selections hit the
    tail, ready optional pages, and host rows (through the hot cache) alike. The first group
    is on ``ref_device`` (REF_DEVICE where it is the reference: its per-request torch ops
    cost no GPU round trips there), the second on the GPU."""
    p, tail = 8, 8 + k_queries
    rng = random.Random(seed)
    required = -(-hot // p) + -(-tail // p)
    sizes = dict(
        num_pages=batch * (required + 40 + max(0, imported_range[1] - 300) // p),
        page_rows=p,
        hot_slots=hot,
        tail_rows=tail,
        reserve_pages=0,
        staging_rows=staging,
        max_requests=batch,
    )
    pair = []
    for device in (ref_device, "cuda"):
        h = Harness(
            device, policy="adaptive", layers=layers, row_bytes=row_bytes, seed=seed, **sizes
        )
        h.provider.pin = device == "cuda"  # host rows page-locked: the kernels read them in place
        pair.append(h)
    rids = [f"r{b}" for b in range(batch)]
    for b, rid in enumerate(rids):
        imported = rng.randint(*imported_range)
        if b == 0:  # the first request has host-only rows: its page 0 is always retired
            imported = max(imported, 4 * p + tail)
        keep = rng.random() * 0.6
        for h in pair:
            h.admit(rid, imported + 64, imported)
            ref.backup(h.group, rid)
        pages = pair[0].group.request(rid).optional_logical_pages()
        drop = [g for g in pages if rng.random() >= keep or (b == 0 and g == 0)]
        for h in pair:
            ref.retire(h.group, rid, drop)
            h.open(rid, k_queries)
    for h in pair:
        h.check()
    first = pair[0].group.request(rids[0])
    assert not bool(first.page_ready[0]) and first.tail_lo > 0  # row 0 is read from host
    return pair[0], pair[1], rids


def selections(
    h: Harness,
    rids: list[str],
    k_queries: int,
    k: int,
    hit_frac: float,
    gen: torch.Generator,
    same_queries: bool = False,
) -> torch.Tensor:
    vis = h.causal_bounds(rids, k_queries).cpu()
    out = torch.empty(len(rids), k_queries, k, dtype=torch.int64)
    for b, rid in enumerate(rids):
        held = [r for r in h.hot_rows(rid) if r >= 0]
        for j in range(k_queries):
            if same_queries and j:
                out[b, j] = out[b, 0]
                continue
            low = h.group.request(rid).tail_lo if hit_frac < 0 else 0  # < 0: tail rows only
            rows = torch.randint(low, int(vis[b, j]), (k,), generator=gen)
            take = torch.rand(k, generator=gen) < hit_frac
            if held:
                rows[take] = torch.tensor(held)[
                    torch.randint(0, len(held), (int(take.sum()),), generator=gen)
                ]
            rows[torch.rand(k, generator=gen) < 0.04] = -1
            out[b, j] = rows
    return out.to(h.group.device)


def run_both(h_ref: Harness, h_k: Harness, rids, sel, copy_layers: tuple = (),
             vis: torch.Tensor | None = None) -> tuple:
    """Both sides' resolve of ``sel`` under ``vis`` (default: the causal bounds)."""
    from kernels import dropin

    vis = h_ref.causal_bounds(rids, sel.shape[1]) if vis is None else vis
    outcome = []
    kernel = functools.partial(dropin.resolve, copy_layers=copy_layers)
    for h, res in ((h_ref, ref.resolve), (h_k, kernel)):
        dev = h.group.device
        try:
            outcome.append(res(h.group, rids, sel.to(dev, copy=True), vis.to(dev, copy=True)))
        except Exception as exc:  # both must fail the same way, with nothing changed
            outcome.append(exc)
    return tuple(outcome)


def check_round(
    h_ref: Harness, h_k: Harness, rids, sel, copy_layers: tuple = (),
    vis: torch.Tensor | None = None,
) -> ref.ResolvePlan | None:
    """One resolve on both sides; the kernel side copies ``copy_layers`` inside its commit
    (zero-copy reads of mapped host rows) and the other layers by apply_copies."""
    from kernels import dropin

    before = snapshot(h_k)
    p_ref, p_k = run_both(h_ref, h_k, rids, sel, copy_layers, vis)
    if isinstance(p_ref, Exception):
        assert type(p_k) is type(p_ref) and str(p_k) == str(p_ref)
        assert_same(before, snapshot(h_k))
        return None
    assert not isinstance(p_k, Exception), p_k
    for f in ("locations", "direct", "copy_batch", "copy_rows", "copy_dst"):
        assert torch.equal(getattr(p_ref, f).cpu(), getattr(p_k, f).cpu()), f
    assert p_ref.epoch == p_k.epoch
    # host_bytes: the kernel side already counts the layers its commit copied
    copied = p_k.copy_rows.numel() * h_k.group.spec.row_bytes * len(copy_layers)
    assert p_k.counts.host_bytes == p_ref.counts.host_bytes + copied
    assert dataclasses.replace(p_ref.counts, host_bytes=0) == dataclasses.replace(
        p_k.counts, host_bytes=0)
    for layer in range(h_ref.layers):
        n_ref = ref.apply_copies(h_ref.group, p_ref, layer)
        if layer in copy_layers and p_k.copy_rows.numel():  # the commit launch copied it:
            with pytest.raises(FailedPrecondition, match="is not pending"):  # once only
                dropin.apply_copies(h_k.group, p_k, layer)
        else:
            assert n_ref == dropin.apply_copies(h_k.group, p_k, layer)
    torch.cuda.synchronize()
    assert dataclasses.asdict(p_ref.counts) == dataclasses.asdict(p_k.counts)
    check_pair(h_ref, h_k, p_ref, sel)
    return p_k


def check_pair(h_ref: Harness, h_k: Harness, plan: ref.ResolvePlan | None = None,
               sel: torch.Tensor | None = None) -> None:
    """The kernel side's state is the reference's (every field a snapshot holds, payload
    bytes included), and it holds the invariants: checked on the reference's copy of that
    state (on the CPU where REF_DEVICE puts it: the per-request checks cost no GPU round
    trips), with the plan's locations (equal on both sides) exact; the hot_rank caches, state
    only the CUDA lookup keeps and a snapshot leaves out, on the kernel side itself."""
    assert_same(snapshot(h_ref), snapshot(h_k))
    if plan is not None:
        assert_exact(h_ref.group, h_ref.truth, plan, sel.to(h_ref.group.device))
    h_ref.check()
    for state in h_k.group.requests.values():
        assert_hot_rank(state)


# where the reference group of a kernel test runs (make_pair's ref_device)
REF_DEVICE = "cpu"

CASES = [  # batch, K, k, hot slots, staging rows, row bytes
    (1, 1, 16, 8, 64, 656),
    (3, 8, 24, 16, 512, 12),
    (17, 3, 40, 64, 2048, 1152),
    (64, 2, 33, 32, 4096, 20),
    (256, 4, 12, 16, 8192, 16),
    (9, 8, 64, 4, 300, 100),  # union >> B: staging overflow, ResourceExhausted on some rounds
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}-K{}-k{}-B{}-S{}-R{}".format(*c))
@pytest.mark.parametrize(
    "select,blocks,hits",
    [("radix", "auto", "auto"), ("radix", "auto", "rank"), ("sort", "auto", "rank"),
     ("radix", "2", "auto"), ("radix", "1", "index"), ("radix_match", "auto", "auto"),
     ("radix", "2x512", "rank"), ("radix", "2x512", "index"), ("sort", "2x512", "auto")]
)
def test_fused_resolver_matches_reference(
    case: tuple, select: str, blocks: str, hits: str, monkeypatch
) -> None:
    monkeypatch.setenv("DHISPARSE_VICTIM_SELECT", select)
    monkeypatch.setenv("DHISPARSE_LOOKUP_BLOCKS", blocks)  # every shape explicitly
    monkeypatch.setenv("DHISPARSE_LOOKUP_HITS", hits)  # auto: rank above the SM count
    batch, k_queries, k, hot, staging, row_bytes = case
    seed = random.randrange(1 << 30)  # fresh inputs every run; printed on failure
    h_ref, h_k, rids = make_pair(seed, batch, k_queries, hot, staging, row_bytes,
                                 ref_device=REF_DEVICE)
    gen = torch.Generator().manual_seed(seed)
    fracs = [0.0, 1.0, 0.98, 0.8, 0.5, 1.0, -1.0, 0.0, 0.9]  # -1: direct lookups (tail only)
    promoted: list[int] = []
    for rnd, hit_frac in enumerate(fracs if batch < 64 else fracs[4:]):
        sel = selections(
            h_ref, rids, k_queries, k, hit_frac, gen, same_queries=hit_frac == 1.0 and rnd % 2 == 1
        )
        check_round(h_ref, h_k, rids, sel)
        if rnd % 2:  # staging promotion: the torch reference against the promote kernel
            from kernels import dropin

            for h, release in ((h_ref, ref.release_staging), (h_k, dropin.release_staging)):
                h.group.readers_finished()
                promoted.append(release(h.group))
            assert promoted[-2] == promoted[-1]
            check_pair(h_ref, h_k)


@pytest.mark.gpu
@pytest.mark.parametrize("k", [700, 1100])
def test_fused_resolver_long_histories_many_entries_and_slots(k: int, monkeypatch) -> None:
    """The paths the small cases miss: K * k = 1400 / 2200 entries (two / four entry groups
    per thread),
    B = 4100 hot slots (above the commit's preloaded mask words, not a multiple of 32; the
    cache fills past slot 4096 before the hit rounds), 132K-140K-row histories (several
    16-byte bitmap groups per thread), against the reference with the invariants after each
    round, with the batch summed by the lookup (drop-in path)."""
    from kernels import dropin

    monkeypatch.setenv("DHISPARSE_COMMIT_PARTS", "auto")
    seed = random.randrange(1 << 30)
    h_ref, h_k, rids = make_pair(seed, 2, 2, 4100, 8192, 16, imported_range=(132_000, 140_000),
                                 ref_device=REF_DEVICE)
    gen = torch.Generator().manual_seed(seed)

    def one_round(hit_frac: float) -> int:
        sel = selections(h_ref, rids, 2, k, hit_frac, gen)
        check_round(h_ref, h_k, rids, sel)
        for h, release in ((h_ref, ref.release_staging), (h_k, dropin.release_staging)):
            h.group.readers_finished()
            release(h.group)
        assert_same(snapshot(h_ref), snapshot(h_k))
        return max(len([r for r in h_k.hot_rows(rid) if r >= 0]) for rid in rids)

    # miss-only rounds until a cache holds rows past slot 4096 (beyond the preloaded mask
    # words): 4-7 rounds at k = 700 (how many depends on the random share of ready pages,
    # whose rows are read in place, not cached), then the hit rounds
    held, fills = 0, 0
    while held <= 4096:
        assert fills < 12, f"the hot caches held {held} rows after {fills} miss-only rounds"
        held, fills = one_round(0.0), fills + 1
    for hit_frac in [0.9, 0.5, 1.0, 0.95]:
        one_round(hit_frac)


STAMP_PATTERNS = {  # LRU stamps of slot s (before the clock moves past them)
    "equal": lambda s, g: torch.full_like(s, 9),  # keys differ in slot bits only
    "few": lambda s, g: torch.randint(1, 4, s.shape, generator=g),  # ties, small bins
    "blocks": lambda s, g: 1 + s // 16,  # runs of 16: a bin can hold exactly what is needed
    "wide": lambda s, g: torch.randint(1, 1 << 40, s.shape, generator=g),  # every key byte varies
    "one_high": lambda s, g: (s % 2) * (1 << 30) + 7,  # two far-apart stamps
}


VICTIM_SIZES = {  # hot slots, selections per query, history rows, share of held rows
    "B600": (600, 300, (2000, 3000), 0.3),
    # > 1024 misses a request (past the radix select: the sort) with B = 4096 (the register
    # sort; the cold fill round's keys are already in order: the in-order shortcut) and B =
    # 6000 (the shared-memory sort)
    "B4096": (4096, 2400, (30000, 32000), 0.05),
    "B6000": (6000, 2400, (30000, 32000), 0.05),
}
VICTIM_SHAPES = [("B600", "1"), ("B4096", "1"), ("B4096", "2x512"), ("B6000", "1")]


@pytest.mark.gpu
@pytest.mark.parametrize("size,shape", VICTIM_SHAPES, ids=lambda v: v)
@pytest.mark.parametrize("pattern", list(STAMP_PATTERNS))
@pytest.mark.parametrize("select", ["radix", "sort", "radix_match"])
def test_victims_are_the_lru_ones_whatever_the_stamps(pattern: str, select: str, size: str,
                                                      shape: str, monkeypatch) -> None:
    """The victim select against the reference's LRU victims on crafted stamps: all equal,
    a few values, runs of 16, 40-bit values, two far-apart values (the radix select skips
    the key bytes every candidate shares and stops at a bin holding exactly the keys still
    needed; the paths a random history seldom reaches); B within, at and past the register
    sort, the 1024-thread lookup and the 512-thread one (8 keys a thread)."""
    from kernels import dropin

    monkeypatch.setenv("DHISPARSE_VICTIM_SELECT", select)
    monkeypatch.setenv("DHISPARSE_LOOKUP_BLOCKS", shape)
    hot, k, history, hit_frac = VICTIM_SIZES[size]
    seed = random.randrange(1 << 30)
    h_ref, h_k, rids = make_pair(seed, 3, 2, hot, 4096, 16, layers=1,
                                 imported_range=history, ref_device=REF_DEVICE)
    gen = torch.Generator().manual_seed(seed)
    fill = check_round(h_ref, h_k, rids, selections(h_ref, rids, 2, k, 0.0, gen))  # cold caches
    if size != "B600":  # > 1024 victims a request out of a cold cache: the sort's path
        assert fill is not None
        assert int(fill.copy_batch.cpu().bincount(minlength=len(rids)).min()) > 1024
    for rnd in range(3):
        for h, release in ((h_ref, ref.release_staging), (h_k, dropin.release_staging)):
            h.group.readers_finished()
            release(h.group)
        g = torch.Generator().manual_seed(seed + rnd)
        top = 0
        for rid in rids:
            slots = torch.arange(h_ref.group.hot_slots)
            stamps = STAMP_PATTERNS[pattern](slots, g)
            top = max(top, int(stamps.max()))
            for h in (h_ref, h_k):
                h.group.request(rid).hot_stamp.copy_(stamps)
        for h in (h_ref, h_k):  # epochs move on past every stamp
            h.group.clock = h.group.finished_epoch = max(h.group.clock, top)
        assert_same(snapshot(h_ref), snapshot(h_k))
        plan = check_round(h_ref, h_k, rids, selections(h_ref, rids, 2, k, hit_frac, gen))
        assert plan is not None and plan.copy_rows.numel() > 0
        if size != "B600":  # the sort's case: > 1024 misses in a request
            copies = torch.bincount(plan.copy_batch.cpu(), minlength=len(rids))
            assert int(copies.max()) > 1024, copies.tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: "b{}-K{}-k{}-B{}-S{}-R{}".format(*c))
@pytest.mark.parametrize(
    "copy_layers,copy_blocks,parts",
    [((0,), "auto", "auto"), ((1, 0), "1", "3"), ((0,), "7", "8"), ((1,), "300", "1")],
)
def test_commit_copies_layers_like_apply_copies(
    case: tuple, copy_layers: tuple, copy_blocks: str, parts: str, monkeypatch
) -> None:
    """Miss copies done inside the commit launch (the kernel's rule, one block, a few, more
    blocks than fit the GPU at once), with 1 to 8 commit blocks per request, give the
    reference's payload bytes, counters and state."""
    monkeypatch.setenv("DHISPARSE_COPY_BLOCKS", copy_blocks)
    monkeypatch.setenv("DHISPARSE_COMMIT_PARTS", parts)
    batch, k_queries, k, hot, staging, row_bytes = case
    seed = random.randrange(1 << 30)
    h_ref, h_k, rids = make_pair(seed, batch, k_queries, hot, staging, row_bytes,
                                 ref_device=REF_DEVICE)
    gen = torch.Generator().manual_seed(seed)
    copied = 0
    for rnd, hit_frac in enumerate([0.0, 0.8, 1.0, 0.5, 0.0]):
        sel = selections(h_ref, rids, k_queries, k, hit_frac, gen)
        if rnd == 0:  # at least one copy whatever the seed (make_pair: row 0 is host-only)
            sel[0, 0, 0] = 0
        plan = check_round(h_ref, h_k, rids, sel, copy_layers)
        copied += 0 if plan is None else plan.copy_rows.numel()
        if rnd % 2:
            from kernels import dropin

            for h, release in ((h_ref, ref.release_staging), (h_k, dropin.release_staging)):
                h.group.readers_finished()
                release(h.group)
            assert_same(snapshot(h_ref), snapshot(h_k))
    assert copied > 0  # the commit did copy rows


def commit_kernels(monkeypatch) -> set[str]:
    """The commit kernels ``kernels.resolver.commit`` launches from now on (filled as it
    looks them up)."""
    from kernels import resolver as kres

    names: set[str] = set()
    real = kres.kernel

    def spy(module: str, func: str, *args):
        if func.startswith("resolve_commit"):
            names.add(func)
        return real(module, func, *args)

    monkeypatch.setattr(kres, "kernel", spy)
    return names


@pytest.mark.gpu
@pytest.mark.parametrize("case", [c for c in CASES if c[5] % 16 == 0],
                         ids=lambda c: "b{}-K{}-k{}-B{}-S{}-R{}".format(*c))
@pytest.mark.parametrize("tma", ["0", "1"])
@pytest.mark.parametrize("copy_blocks", ["auto", "1", "300"])
def test_commit_copies_by_tma_or_by_loads_alike(case: tuple, tma: str, copy_blocks: str,
                                               monkeypatch) -> None:
    """The commit's miss copies of two layers by the tensor memory accelerator (one bulk copy
    per row through shared memory) or by 16-byte loads: the reference's payload bytes and
    state either way; the launches took the kernel asked for. (The preload and refused
    calls after it: test_sync_free_path.py.)"""
    monkeypatch.setenv("DHISPARSE_COPY_TMA", tma)
    monkeypatch.setenv("DHISPARSE_COPY_BLOCKS", copy_blocks)
    names = commit_kernels(monkeypatch)
    batch, k_queries, k, hot, staging, row_bytes = case
    seed = random.randrange(1 << 30)
    h_ref, h_k, rids = make_pair(seed, batch, k_queries, hot, staging, row_bytes,
                                 ref_device=REF_DEVICE)
    gen = torch.Generator().manual_seed(seed)
    copied = 0
    for rnd, hit_frac in enumerate([0.0, 0.8, 0.5, 0.0]):
        sel = selections(h_ref, rids, k_queries, k, hit_frac, gen)
        if rnd == 0:  # at least one copy whatever the seed (make_pair: row 0 is host-only)
            sel[0, 0, 0] = 0
        plan = check_round(h_ref, h_k, rids, sel, (1, 0))
        copied += 0 if plan is None else plan.copy_rows.numel()
    assert copied > 0, seed
    assert names == {"resolve_commit_16_tma" if tma == "1" else "resolve_commit_16"}, names


@pytest.mark.gpu
def test_the_tma_kernel_copies_calls_below_its_rows_by_loads(monkeypatch) -> None:
    """DHISPARSE_COPY_TMA=auto on rows of whole 128-byte lines: a batch whose entries could
    miss 8192 rows takes the TMA kernel, and its calls that miss fewer copy by loads inside
    it (tma_min_rows); the reference's bytes and state all the same."""
    monkeypatch.setenv("DHISPARSE_COPY_TMA", "auto")
    names = commit_kernels(monkeypatch)
    seed = random.randrange(1 << 30)
    # 32 x 2 x 64 x 2 layers
    h_ref, h_k, rids = make_pair(seed, 32, 2, 64, 4096, 128, ref_device=REF_DEVICE)
    gen = torch.Generator().manual_seed(seed)
    copied = 0
    for hit_frac in (0.8, 0.5, 0.9):  # at most half the 8192 entries miss
        sel = selections(h_ref, rids, 2, 64, hit_frac, gen)
        sel[0, 0, 0] = 0  # a copy every round (make_pair: request 0's row 0 is host-only)
        plan = check_round(h_ref, h_k, rids, sel, (1, 0))
        n = 0 if plan is None else plan.copy_rows.numel()
        assert 2 * n < 8192, (seed, n)  # below the kernel's rows over both layers: by loads
        copied += n
    assert copied > 0, seed
    assert names == {"resolve_commit_16_tma"}, names
