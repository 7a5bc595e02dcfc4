"""Where the TMA commit kernel's cost on calls without misses comes from (issue 7): the
same sync-free calls (``Case``: lookup + commit of one payload layer) timed under variants
of the commit launch, interleaved in rounds so that drift hits every variant alike, and
within a case call by call (``--interleave 1``, the default since run 78 found bursts of
outside disturbance lasting many calls; ``schedule``).

Variants (``VARIANTS``): the plain kernel, the TMA kernel (``resolve_commit_16_tma``, TMA
asked from 0 rows on, so at few misses not the default path since 0f1279e) or the default
path (``auto*``: ``DHISPARSE_COPY_TMA`` as set, auto by default);
the kernels' preferred shared-memory carveout (cudaFuncAttributePreferredSharedMemoryCarveout,
default -1 = the driver's choice, 100 = all shared); the dynamic shared memory the commit
launch asks for (the TMA kernel's row buffers, or none where a call has no misses, or the
buffers' size given to the plain kernel that never uses them); the TMA kernel built without
its preload by TMA (the default since run 67; ``-DRESOLVER_TMA_PRELOAD`` builds it in: the
first rows go out before the lookup ends; by default the preload prefetches the first round
of a TMA call's rows into L2, since run 72; ``-DRESOLVER_NO_TMA_WARM`` does not);
the TMA copies inlined (``-DRESOLVER_TMA_INLINE``), the copies by loads not inlined
(``-DRESOLVER_COPY_NOINLINE``), their 64-bit form inlined (``-DRESOLVER_WIDE_INLINE``; out of
line by default since run 64); the lookup in two 512-thread blocks per SM
(``DHISPARSE_LOOKUP_BLOCKS=2x512``, ``Variant.lookup_blocks``; auto's shape above the SM
count since run 105, ``*_lookup1`` the one-block shape there); the commit launch's commit
blocks first in its grid (``-DRESOLVER_COMMIT_FIRST``, ``*_commitfirst``: the order until
run 105); the table's map_hi at every page (``auto_mapall``: every row divided and its page
loads issued, as before map_hi); the default path without the copy blocks' preload
(``auto_early0``); pass 1 in groups of 4 in the 512-thread build's rank kernels
(``-DRESOLVER_TWO_G4``, ``auto_twog4``: the lookup before run 133); the rank form's cache
by the compiler's generic loads (``-DRESOLVER_RANK_GENERIC``, ``auto_rankgeneric``: the
lookup before run 140); and, as diagnostics,
the call after an untimed one of the same case on other memory (``auto_warmcode``: lookup
and commit, ``auto_warmlookup``: the lookup alone; their code in L2 again after the flush)
or after a sum over 16 MB (``auto_warmread``: the flush's dirty lines evicted, no code of
ours). Switches that measured
nothing were removed with their variants: the lookup's sort, its miss path, the batch sums
and a copy block's copies out of line, never-run padding code (runs 64-67,
bench/README.md), more rows warmed in L2 (run 73), the victims listed in LRU order against
slot order (runs 76 and 79); so were those whose question was answered: the rank form's
cache read in three dependent round trips (``*_rank2trips``, run 86: the one-round-trip
read is the default since) and more blocks for sparse misses (``*_sparse<n>``, the
COPY_BLOCKS_SPARSE build, run 94: the few-miss rule since, ``*_few_off`` / ``*_few<n>``), the
rank form's cache by bulk copies of the TMA and a commit block's first lines asked of L2
before its wait (RESOLVER_RANK_BULK, RESOLVER_COMMIT_TOUCH: runs 120 and 123); so was the
rank form's prefix scanned from the bitmap (RESOLVER_PREFIX_SCAN, run 125: the cached
prefix is the default since); so were, in runs 126-130, copy blocks taking the commit roles
when nothing is pending (RESOLVER_STEAL), the code prefetched by the lookup
(RESOLVER_CODE_PREFETCH: a kernel's own address reads 0 without relocatable device code),
a commit block's first lines loaded before its wait (RESOLVER_PRETOUCH), 2 or 4 commit
parts or 16 copy blocks at batch 160, and pass 1's unroll capped in every kernel
(RESOLVER_PASS1_MAXG, run 132); so were, in runs 136-139, the rank form's selection in shared
memory (RESOLVER_SEL_GLOBAL), its cache and selection by other load kinds (L2-only,
evict-first, L1-keeping: RESOLVER_RANK_CG / _CS / _CA / _CG_SEL) and pass 1's loads through
the table's pointers as global loads (RESOLVER_PASS1_GENERIC); run 141, the commit's
stamps by global stores (RESOLVER_STAMP_GLOBAL); and, runs 142-143, the hit stamping's
diagnostics (RESOLVER_DIAG_NO_HIT_STAMP / _NO_HIT_PROTECT / _FULL_STAMP: no stamps, no
protect flags -- the store pattern since the flags went --, every slot stamped) and the
stamps prefetched into L2 by the lookup or the commit (RESOLVER_STAMP_PREFETCH=1-3).
Cold cases (``32:cold``: every selected row never read) and ``auto_k8`` (K = 8 identical
queries, run 146) time the K = 8 target call by call; the builds that split it in run 147
(RESOLVER_SAME_UNROLL8, RESOLVER_DIAG_ASSUME_SAME: no identical-queries check,
RESOLVER_DIAG_NO_LOC_COPY: the other queries' locations not written; the check is most of
it) were removed after it, as b0cca14 has them. Where the copy blocks at work run: the
``*_smid`` builds (RESOLVER_DIAG_SMID) record each one's SM (``smid_stats``, run 155: with
PDL the batch-160 sparse rule's 16 share 8-9 SMs); ``auto_nopdl*`` launch the commit without
programmatic dependent launch (``Variant.pdl``; on run 162's slow machine -153 us at 1152 B,
batch 160, 20% misses). Two builds that spread the working blocks measured no better and
were removed: every other block at work (RESOLVER_SPARSE_STEP=2, ``auto_step2*``; runs 154,
158 and 162; b3707f6 and 20ebc32 have it) and shares claimed by SM, one working block to an
SM (RESOLVER_SM_ROLES, ``auto_smroles*``; runs 163-164, c08d2bf has it). ``auto_k8_unroll4``: the
identical-queries check issuing 4 queries' loads at a time (RESOLVER_SAME_UNROLL4, the check
before run 156; 7 at a time since). Run 156's other K = 8 build, pass 2 writing the identical
queries' locations where it writes the first's (RESOLVER_LOC_IN_PASS2), measured nothing
(+0.3 cold, -0.05 without misses against K = 8) and was removed; 7a983fe has it.

    python3 -m bench.resolver.tma_cost --out tma_cost.json      # on the GPU machine
    python3 -m bench.resolver.tma_cost --summary bench/results/tma_cost_eff1103.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import NamedTuple

import torch

from bench.common import Flusher, environment, time_gpu, write_json
from bench.resolver.case import Case
from bench.resolver.pool import State, alloc_host, fill_random, missed_rows, windows_of
from bench.resolver.report import print_md


class Variant(NamedTuple):
    """How a variant's calls go out."""

    tma: bool | None  # the TMA commit kernel from 0 rows on, the plain one, or None: as the
    # default path (DHISPARSE_COPY_TMA; auto: TMA from 8192 rows of whole 128-byte lines)
    lookup_carveout: int = -1  # -1 = the driver's choice, 0 = the most L1, 100 = the most shared
    commit_carveout: int = -1
    shared: int | str | None = None  # the commit's dynamic shared bytes: None = the wrapper's,
    # "tma" = the TMA kernel's row buffers
    flags: tuple[str, ...] = ()  # extra compile flags
    misses_ok: bool = True  # runs the cases with misses
    early: bool | None = None  # the copy blocks' preload: None = DHISPARSE_COPY_EARLY
    lookup_blocks: str | None = None  # DHISPARSE_LOOKUP_BLOCKS: None = as the environment has it
    copy_floor: str | None = None  # the launched copy blocks: what the commit blocks leave of
    # one wave, at least COPY_FLOORS[copy_floor] (None: the wrapper's launched_copy_blocks)
    map_all: bool = False  # the table's map_hi at every page (the lookup then divides and
    # loads page_map / page_ready for every row, as before map_hi), not the State's 0
    warm: str | None = None  # after the flush, one untimed "call" (or "lookup") of the same
    # case on a State of its own: the kernels' code (and none of the timed call's data) in L2;
    # "read": a sum over 16 MB of other memory (the flush's dirty lines out, no code of ours)
    queries: int = 1  # K: identical queries per request (the K = 8 target: one copy per row)
    pdl: bool = True  # the commit by programmatic dependent launch (False: DHISPARSE_PDL=0)


SMID = "-DRESOLVER_DIAG_SMID"  # build flag: the copy blocks at work record their SM (smid_stats)
DIAG_SMID_MAX = 1024  # resolver_commit.cu: the entries of its diag_smid


VARIANTS = {
    "plain": Variant(False),
    "tma": Variant(True),
    "plain_with_tma_shared": Variant(False, shared="tma"),
    "tma_no_shared": Variant(True, shared=0, misses_ok=False),
    "tma_preload": Variant(True, flags=("-DRESOLVER_TMA_PRELOAD",)),
    "tma_inline": Variant(True, flags=("-DRESOLVER_TMA_INLINE",)),
    "plain_copy_noinline": Variant(False, flags=("-DRESOLVER_COPY_NOINLINE",)),
    "tma_copy_noinline": Variant(True, flags=("-DRESOLVER_COPY_NOINLINE",)),
    "plain_wide_inline": Variant(False, flags=("-DRESOLVER_WIDE_INLINE",)),
    "plain_early0": Variant(False, early=False),
    "tma_early0": Variant(True, early=False),
    "tma_no_warm": Variant(True, flags=("-DRESOLVER_NO_TMA_WARM",)),
    "plain_commit_carveout100": Variant(False, commit_carveout=100),
    "tma_lookup_carveout0": Variant(True, lookup_carveout=0),
    "plain_lookup_carveout0": Variant(False, lookup_carveout=0),
    "plain_lookup2x512": Variant(False, lookup_blocks="2x512"),
    "tma_lookup2x512": Variant(True, lookup_blocks="2x512"),
    "plain_few_off": Variant(False, flags=("-DRESOLVER_COPY_FEW_OFF",)),
    "tma_few_off": Variant(True, flags=("-DRESOLVER_COPY_FEW_OFF",)),
    "tma_few24": Variant(True, flags=("-DCOPY_BLOCKS_FEW=24",)),
    "tma_few32": Variant(True, flags=("-DCOPY_BLOCKS_FEW=32",)),
    "plain_few24": Variant(False, flags=("-DCOPY_BLOCKS_FEW=24",)),
    "plain_few32": Variant(False, flags=("-DCOPY_BLOCKS_FEW=32",)),
    "auto": Variant(None),
    "auto_commitfirst": Variant(None, flags=("-DRESOLVER_COMMIT_FIRST",)),
    "auto_lookup1": Variant(None, lookup_blocks="1"),
    "auto_lookup1_commitfirst": Variant(None, flags=("-DRESOLVER_COMMIT_FIRST",),
                                        lookup_blocks="1"),
    "plain_commitfirst": Variant(False, flags=("-DRESOLVER_COMMIT_FIRST",)),
    "tma_commitfirst": Variant(True, flags=("-DRESOLVER_COMMIT_FIRST",)),
    "plain_lookup1": Variant(False, lookup_blocks="1"),
    "tma_lookup1": Variant(True, lookup_blocks="1"),
    "plain_lookup1_commitfirst": Variant(False, flags=("-DRESOLVER_COMMIT_FIRST",),
                                         lookup_blocks="1"),
    "tma_lookup1_commitfirst": Variant(True, flags=("-DRESOLVER_COMMIT_FIRST",),
                                       lookup_blocks="1"),
    "auto_wave": Variant(None, copy_floor="48"),
    "auto_one_per_sm": Variant(None, copy_floor="sms"),
    "auto_mapall": Variant(None, map_all=True),
    "auto_early0": Variant(None, early=False),
    "auto_warmcode": Variant(None, warm="call", misses_ok=False),
    "auto_warmlookup": Variant(None, warm="lookup", misses_ok=False),
    "auto_warmread": Variant(None, warm="read"),
    "auto_twog4": Variant(None, flags=("-DRESOLVER_TWO_G4",)),
    "auto_rankgeneric": Variant(None, flags=("-DRESOLVER_RANK_GENERIC",)),
    "auto_k8": Variant(None, queries=8),
    "auto_nopdl": Variant(None, pdl=False),
    "auto_smid": Variant(None, flags=(SMID,)),
    "auto_nopdl_smid": Variant(None, flags=(SMID,), pdl=False),
    "auto_commitfirst_smid": Variant(None, flags=("-DRESOLVER_COMMIT_FIRST", SMID)),
    "auto_k8_unroll4": Variant(None, flags=("-DRESOLVER_SAME_UNROLL4",), queries=8),
}

# Variant.copy_floor: run 113's rule (at least 48) and the rule before it (one per SM)
COPY_FLOORS = {"48": lambda sms: 48, "sms": lambda sms: sms}


def floored_copy_blocks(floor: str):
    """``launched_copy_blocks`` of Variant.copy_floor ``floor``: what the commit blocks leave
    of one wave of COPY_BLOCKS_PER_SM blocks per SM, at least the floor."""
    from kernels.resolver_settings import COPY_BLOCKS_PER_SM

    least = COPY_FLOORS[floor]
    return lambda commit_blocks, sms: max(least(sms), COPY_BLOCKS_PER_SM * sms - commit_blocks)


def smid_table(kres, dev: int):
    """The RESOLVER_DIAG_SMID build's table (int32 [DIAG_SMID_MAX], a copy block's SM by its
    share, -1 where none) in the module of the defines in effect, as a CuPy array."""
    import cupy

    from kernels._loader import module

    mem = module("resolver", dev, tuple(kres.defines())).get_global("diag_smid")
    return cupy.ndarray((DIAG_SMID_MAX,), cupy.int32, memptr=mem)  # (the pointer has no size)


def smid_stats(table) -> dict[str, int]:
    """Copy blocks at work, the SMs they ran on and the most of them on one SM."""
    sms = [int(x) for x in table.get() if x >= 0]
    per = {s: sms.count(s) for s in set(sms)}
    return {"blocks": len(sms), "sms": len(per), "most_on_one_sm": max(per.values(), default=0)}


def variant_env(v: Variant, blocks: str | None, pdl: str | None) -> None:
    """The environment a variant's calls go out under: its lookup shape, else ``blocks``
    (DHISPARSE_LOOKUP_BLOCKS as the run found it), and DHISPARSE_PDL=0 where it goes without
    PDL, else ``pdl`` (as the run found it; None: unset)."""
    set_env("DHISPARSE_LOOKUP_BLOCKS", v.lookup_blocks or blocks)
    set_env("DHISPARSE_PDL", pdl if v.pdl else "0")


def set_env(var: str, value: str | None) -> None:
    """``var`` = ``value``, or unset where ``value`` is None."""
    if value is None:
        os.environ.pop(var, None)
    else:
        os.environ[var] = value


class Launches:
    """Wraps ``kernels.resolver``'s two launch functions (the lookup goes out by ``launch``,
    the commit -- ``Case``: dependent -- by the other) and its ``defines``: sets each
    kernel's carveout, replaces the commit's dynamic shared memory and adds compile flags as
    the variant says. ``end_variant`` undoes a variant's opt-ins to more shared memory (the
    kernels are cached: the next variant gets them as loaded); ``restore`` unwraps."""

    def __init__(self, kres) -> None:
        self.kres = kres
        self.launch, self.dependent, self.defines = kres.launch, kres.launch_dependent, kres.defines
        self.lookup_carveout = self.commit_carveout = -1
        self.shared: int | None = None
        self.flags: tuple[str, ...] = ()
        self.opted: dict[object, int] = {}  # kernel -> its max dynamic shared bytes before
        kres.launch = self._wrap(self.launch, False)
        kres.launch_dependent = self._wrap(self.dependent, True)
        kres.defines = lambda: self.defines() + self.flags

    def _wrap(self, inner, commit: bool):
        def launch(fn, grid, block, args, shared=0):
            fn.preferred_shared_memory_carveout = (self.commit_carveout if commit
                                                   else self.lookup_carveout)
            if commit and self.shared is not None:
                shared = self.shared
                if shared > fn.max_dynamic_shared_size_bytes:  # the plain kernel given the
                    self.opted.setdefault(fn, fn.max_dynamic_shared_size_bytes)  # TMA buffers
                    fn.max_dynamic_shared_size_bytes = shared
            return inner(fn, grid, block, args, shared)
        return launch

    def end_variant(self) -> None:
        for fn, before in self.opted.items():
            fn.max_dynamic_shared_size_bytes = before
        self.opted.clear()

    def restore(self) -> None:
        self.end_variant()
        self.kres.launch, self.kres.launch_dependent = self.launch, self.dependent
        self.kres.defines = self.defines


DEFAULT_VARIANTS = ("plain", "tma", "tma_inline", "tma_preload", "plain_copy_noinline",
                    "tma_copy_noinline")


WARMUP = 2  # warm-up calls of a variant in a case, after its check
UNTIMED = 1 + WARMUP  # its check and warm-ups: the row windows before its timed calls


def windows_needed(names: list[str], reps: int, misses: bool) -> int:
    """Row windows one case takes in a round: every variant that runs it (variants without
    misses_ok skip cases with misses) takes its check, WARMUP warm-up calls and reps."""
    return sum(UNTIMED + reps for n in names if VARIANTS[n].misses_ok or not misses)


def schedule(names: list[str], reps: int, interleave: bool) -> list[tuple[str, int]]:
    """The order of a case's timed calls, (variant, rep): call by call in turn (A, B, A, B,
    ...: a burst of outside disturbance falls on every variant alike; run 78 had such bursts
    of many calls) or each variant's calls back to back (runs 66-79)."""
    if interleave:
        return [(n, r) for r in range(reps) for n in names]
    return [(n, r) for n in names for r in range(reps)]


def differences(rec: dict, base: str = "plain") -> dict[str, dict[tuple[int, str], float]]:
    """Per variant other than ``base``: the mean over rounds of its µs minus ``base``'s in
    the same round, by case (batch, profile); rounds or cases without both are left out."""
    us = {(r["round"], r["batch"], r["profile"], r["variant"]): r["us"] for r in rec["results"]}
    out: dict[str, dict[tuple[int, str], list[float]]] = {}
    for (rnd, bs, prof, name), t in us.items():
        if name != base and (rnd, bs, prof, base) in us:
            out.setdefault(name, {}).setdefault((bs, prof), []).append(
                t - us[(rnd, bs, prof, base)])
    return {n: {c: sum(d) / len(d) for c, d in cases.items()} for n, cases in out.items()}


def differences_md(rec: dict, base: str = "plain") -> str:
    """``differences`` as a markdown table: a row per variant, a column per case (in the
    order the results hold them), µs against ``base`` in the same round."""
    cases = list(dict.fromkeys((r["batch"], r["profile"]) for r in rec["results"]))
    diffs = differences(rec, base)
    head = " | ".join(f"{p}, batch {b}" for b, p in cases)
    lines = [f"| variant (µs against {base}) | {head} |", "|---|" + "---|" * len(cases)]
    for name, by_case in diffs.items():
        cells = " | ".join(f"{by_case[c]:+.1f}" if c in by_case else "-" for c in cases)
        lines.append(f"| {name} | {cells} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="JSON to write (required unless --summary)")
    ap.add_argument("--summary", metavar="JSON",
                    help="print the differences table of an earlier run's JSON and exit")
    ap.add_argument("--item", type=int, default=1152)
    ap.add_argument("--cases", default="1:hit100,32:hit100,160:hit100,32:miss20,160:miss20")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                    help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--interleave", type=int, choices=(0, 1), default=1,
                    help="1: the variants' timed calls in turn, call by call; 0: each "
                         "variant's calls back to back (runs 66-79)")
    args = ap.parse_args()
    if args.summary:
        with open(args.summary) as f:
            rec = json.load(f)
            print_md(differences_md(rec, rec.get("differences_base", "plain")))
        return
    if not args.out:
        ap.error("--out is required (or --summary JSON)")
    from kernels import resolver as kres
    from kernels._loader import kernel

    dev = torch.device("cuda")
    cases = [(int(b), p) for b, p in (c.split(":") for c in args.cases.split(","))]
    names = args.variants.split(",")
    P, S, k, B, item = max(b for b, _ in cases), 100_000, 2048, 4096, args.item
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; known: {list(VARIANTS)}")
    for prof in {p for _, p in cases}:  # no call reads a row an earlier one of its round read
        m, n = missed_rows(prof, k), sum(p == prof for _, p in cases)
        cold = prof == "cold"
        need, have = n * windows_needed(names, args.reps, m > 0), windows_of(S, B, k, m, cold)
        if need > have:
            raise SystemExit(f"{prof}: {n} case(s) x these variants x (--reps {args.reps} + "
                             f"{UNTIMED}) calls need {need} row windows a round, a state has "
                             f"{have}")
    host, how = alloc_host(P * S * item)
    fill_random(host, dev)
    flush = Flusher(dev)
    rec = {"environment": environment(), "host_alloc": how, "item_bytes": item, "top_k": k,
           "hot_buffer": B, "reps": args.reps, "interleave": bool(args.interleave),
           "variants": {n: {f: str(x) for f, x in VARIANTS[n]._asdict().items()}
                        for n in names},
           "results": []}
    t0 = time.time()
    wrap = Launches(kres)
    blocks = os.environ.get("DHISPARSE_LOOKUP_BLOCKS")  # the lookup shape of the other variants
    pdl = os.environ.get("DHISPARSE_PDL")
    cur = torch.cuda.current_device()  # the device the calls' kernels are built for
    launched = kres.launched_copy_blocks
    map_at = kres.TABLE_COLUMNS.index("map_hi")
    try:
        for rnd in range(args.rounds):
            st = State(P, S, B, dev)  # a fresh row order per round: fresh windows
            pool = torch.empty(st.pool_rows, item, dtype=torch.uint8, device=dev)
            offs = dict.fromkeys((p for _, p in cases), 0)  # next window, by profile
            for bs, prof in cases:
                m = missed_rows(prof, k)
                cold = prof == "cold"  # every selected row never read, no row resident
                run = [n for n in names if not m or VARIANTS[n].misses_ok]
                by_k = {K: Case(st, host, pool, item, bs, K, k, m, cold)  # Variant.queries
                        for K in {1} | {VARIANTS[n].queries for n in run}}
                off = offs[prof]
                warm = None  # Variant.warm: the same case on a State of its own (hits only)
                reader = torch.ones(4 << 20, device=dev) if any(
                    VARIANTS[n].warm == "read" for n in run) else None
                if any(VARIANTS[n].warm in ("call", "lookup") for n in run):
                    wst = State(bs, S, B, dev)
                    wpool = torch.empty(wst.pool_rows, item, dtype=torch.uint8, device=dev)
                    warm = Case(wst, host, wpool, item, bs, 1, k, 0, False)
                    warm.before(0)

                def use(name: str, by_k=by_k, pages=st.page_map.shape[1]) -> Case:
                    v = VARIANTS[name]
                    case = by_k[v.queries]
                    wrap.lookup_carveout = v.lookup_carveout
                    wrap.commit_carveout = v.commit_carveout
                    wrap.shared = kres.TMA_ROWS * item if v.shared == "tma" else v.shared
                    wrap.flags, case.tma, case.early = v.flags, v.tma, v.early
                    variant_env(v, blocks, pdl)
                    kres.launched_copy_blocks = (floored_copy_blocks(v.copy_floor)
                                                 if v.copy_floor else launched)
                    case.table[:, map_at] = pages if v.map_all else 0
                    return case

                # each variant: its check and warm-up calls, then its timed calls, each call
                # on its own row window from the variant's first one
                first, ok, ts = {}, {}, {n: [] for n in run}
                placed: dict[str, list] = {n: [] for n in run if SMID in VARIANTS[n].flags}
                for name in run:
                    c = use(name)
                    first[name], ok[name] = off, c.check(off)["ok"]
                    time_gpu(lambda i, o=off, c=c: c.call(i + o + 1), 0, WARMUP,
                             before=lambda i, o=off, c=c: c.before(i + o + 1))
                    off += UNTIMED + args.reps
                    wrap.end_variant()
                for name, r in schedule(run, args.reps, bool(args.interleave)):
                    c = use(name)
                    w = first[name] + UNTIMED + r  # the call's own row window
                    table = smid_table(kres, cur) if name in placed else None
                    if table is not None:
                        table.fill(-1)
                    fl = flush
                    if VARIANTS[name].warm:
                        def fl(warm=warm, how=VARIANTS[name].warm, reader=reader) -> None:
                            flush()
                            if how == "read":
                                reader.sum()
                            else:
                                getattr(warm, how)(0)
                    ts[name] += time_gpu(lambda i, w=w, c=c: c.call(w), 1, 0,
                                         before=lambda i, w=w, c=c: c.before(w), flush=fl)
                    if table is not None:
                        placed[name].append(smid_stats(table))
                    wrap.end_variant()
                for name in run:
                    us = statistics.median(ts[name])
                    rec["results"].append({"round": rnd, "batch": bs, "profile": prof,
                                           "variant": name, "ok": ok[name], "us": us,
                                           "us_all": [round(t, 2) for t in ts[name]],
                                           **({"smid": placed[name]} if name in placed else {})})
                    where = "".join(f" [{p['blocks']} on {p['sms']} SMs, <={p['most_on_one_sm']}]"
                                    for p in placed.get(name, [])[:3])
                    print(f"round {rnd} bs={bs:3d} {prof:6s} {name:22s} us={us:8.1f} "
                          f"ok={ok[name]} ({time.time() - t0:.0f}s){where}", flush=True)
                write_json(args.out, rec)
                offs[prof] = off
                del by_k, warm, reader
            del st, pool
    finally:
        wrap.restore()
        set_env("DHISPARSE_LOOKUP_BLOCKS", blocks)
        set_env("DHISPARSE_PDL", pdl)
        kres.launched_copy_blocks = launched
    # the commit kernels' registers and spills as loaded (the plain one, the TMA one; W 16)
    for fn_name in ("resolve_commit_16", "resolve_commit_16_tma"):
        fn = kernel("resolver", fn_name, cur, fn_name.endswith("tma"), kres.defines())
        rec.setdefault("kernels", {})[fn_name] = {
            "num_regs": fn.num_regs, "local_size_bytes": fn.local_size_bytes,
            "shared_size_bytes": fn.shared_size_bytes}
    base = "plain" if "plain" in names else names[0]
    if len(names) > 1:
        rec["differences_base"] = base
        rec["differences_md"] = differences_md(rec, base)
        print_md(rec["differences_md"])
    write_json(args.out, rec)


if __name__ == "__main__":
    main()
