"""The resolver wrappers' settings: environment variables (each refused with an
InvalidArgument naming it, before any state changes) and the rules their ``auto`` values
follow. ``kernels.resolver`` re-exports every name here.
"""

from __future__ import annotations

import os

from services.common.errors import InvalidArgument

# lookup's select_mode: 0 bitonic sort; 1 radix select counting bins with __match_any_sync
# aggregation; 2 the same with one shared atomic per key (faster on the H200, 0170b9e)
VICTIM_SELECT = {"sort": 0, "radix_match": 1, "radix": 2}
MAX_COPY_BLOCKS = 1 << 16  # DHISPARSE_COPY_BLOCKS / copy_blocks
MAX_COMMIT_PARTS = 8  # DHISPARSE_COMMIT_PARTS / commit(parts=)


def default_select() -> str:
    """Victim choice of ``lookup``: ``DHISPARSE_VICTIM_SELECT`` (radix | radix_match |
    sort), default radix. The register bitonic sort of 4096 keys costs ~20 us more at batch
    1 and 20% misses (H200, 612df49: 72.6 vs 52.3 us per call); an already sorted cache
    (cold: stamps 0, slot order) skips it after one check either way. radix_match counts the
    radix bins with warp-aggregated atomics (__match_any_sync): the same victims, slower on
    the H200 (phase trace at 0170b9e: the select 9.5 vs 6.9 us at 2% misses, batch 1)."""
    value = os.environ.get("DHISPARSE_VICTIM_SELECT", "radix")
    if value not in VICTIM_SELECT:
        raise InvalidArgument(
            f"DHISPARSE_VICTIM_SELECT={value!r} must be one of {sorted(VICTIM_SELECT)}"
        )
    return value


def defines() -> tuple[str, ...]:
    """Compile-time variant of the resolver kernels: ``DHISPARSE_RESOLVER_TRACE=1`` builds the phase
    trace in (``bench/resolver/trace.py`` reads it); same results, a few stores more.
    ``DHISPARSE_RESOLVER_LINEINFO=1`` adds source line info for a profiler (same code).
    ``DHISPARSE_RESOLVER_TMA_PRELOAD=1`` builds the TMA kernel's preload by TMA in (the
    sync-free path's first rows by TMA before the lookup ends; resolver_copy.cuh
    ``preload_tma``): same results; off by default, its code slows calls without misses."""
    switches = (("DHISPARSE_RESOLVER_TRACE", "-DRESOLVER_TRACE"),
                ("DHISPARSE_RESOLVER_LINEINFO", "-lineinfo"),
                ("DHISPARSE_RESOLVER_TMA_PRELOAD", "-DRESOLVER_TMA_PRELOAD"))
    return tuple(flag for var, flag in switches if _switch(var, "0"))


def _switch(var: str, default: str) -> bool:
    """``var`` = 1 | 0 (``default`` when unset); anything else is refused, naming it."""
    value = os.environ.get(var, default)
    if value not in ("0", "1"):
        raise InvalidArgument(f"{var}={value!r} must be 0 or 1")
    return value == "1"


LOOKUP_HITS = ("auto", "index", "rank")
RANK_MAX_SLOTS = 65535  # the rank form's prefix of held rows is 16-bit


def hit_form(hits: str | None, hot_slots: int, rank_fits: bool, batch: int, sms: int) -> str:
    """How the lookup finds hot hits: ``hits``, else ``DHISPARSE_LOOKUP_HITS``:

    - index: one load of the request's ``hot_index`` per entry (a random 32-byte sector of
      an 8-byte-per-row array);
    - rank: the request's hot_rank cache (held-row bitmap, its prefix, entries by rank) read
      into shared memory, rebuilt from hot_rows where a writer made it stale
      (resolver_rank.cuh); needs
      B <= 65535 and 6 more bytes of shared memory per 32 rows (``rank_fits``);
    - auto (the default): rank above the SM count where it can run, else index.

    The rule follows the blocks sweep (H200, 665bb5b, 656 B, top_k 2048, B 4096, 100K-row
    requests, one 1024-thread block per SM; index / rank, us per call): no misses 13.6 /
    15.4 at batch 1, 15.2 / 16.1 at 32, 31.4 / 29.6 at 160; 2% misses 31.5 / 36.0,
    55.6 / 59.3, 225.2 / 229.7; 20% misses 42.1 / 47.3, 274.7 / 276.3, 1418.8 / 1398.9. The
    cache costs a dependent round trip before pass 1 and, after a call whose misses took
    slots, a rebuild (~5 us at batch 1); the random index loads it replaces cost most where
    the batch fills the GPU (160 requests x 2048 loads). With two 512-thread blocks per SM
    (DHISPARSE_LOOKUP_BLOCKS=2x512) rank takes batch 160 without misses to 23.5 us (index
    29.4). Same results every way. Asking for rank where it cannot run is refused; without
    a hot cache (B = 0) there are no hits to find and either form is the index form."""
    value = hits if hits is not None else os.environ.get("DHISPARSE_LOOKUP_HITS", "auto")
    name = "hits" if hits is not None else "DHISPARSE_LOOKUP_HITS"
    if value not in LOOKUP_HITS:
        raise InvalidArgument(f"{name}={value!r} must be one of {LOOKUP_HITS}")
    can = 0 < hot_slots <= RANK_MAX_SLOTS and rank_fits
    if value == "rank" and hot_slots > RANK_MAX_SLOTS:
        raise InvalidArgument(
            f"{name}='rank' needs hot_slots <= {RANK_MAX_SLOTS} (got {hot_slots})")
    if value == "rank" and hot_slots and not rank_fits:
        raise InvalidArgument(f"{name}='rank': its shared memory (6 more bytes per 32 rows) "
                              "does not fit the SM's for these rows and slots")
    if value == "index" or not can or (value == "auto" and batch <= sms):
        return "index"
    return "rank"


LOOKUP_SHAPES = {"1": (1024, 1), "2": (1024, 2), "2x512": (512, 2)}  # threads, blocks per SM


def lookup_shape(batch: int = 0, sms: int = 0) -> tuple[int, int]:
    """Lookup threads per block and blocks per SM, ``DHISPARSE_LOOKUP_BLOCKS``: auto (the
    default) takes 2x512 for a batch above the SM count ``sms``, else 1.

    - 1: 1024 threads, one block per SM, 64 registers, 4 loads in flight per thread. A
      batch above the SM count runs in two waves.
    - 2: 1024 threads, two per SM: 32 registers, 2 loads in flight. Since hits are found by
      ``hot_index`` it spills (312 / 440 bytes stored / loaded, ptxas at 5607534) and was
      slower at batch 160 in the same call (H200, f238ac9, 656 B, top_k 2048, against 1: no
      misses 31.1 vs 30.2 us, 2% 233.1 vs 227.2, 20% 1559.8 vs 1479.2).
    - 2x512: 512 threads, two per SM, 64 registers and 4 loads in flight: a batch up to
      twice the SM count in one wave, each block with the loads of a 1024-thread one in
      flight. Faster without misses above the SM count (batch 160: 28.0 vs 30.2 us, 2%:
      225.0 vs 227.2) but slower where the copies dominate (20%: 1539.0 vs 1479.2; cold
      4941 vs 4725 us, 1152 B 7828 vs 7574; with 16 copy blocks 5634 vs 4621: the copy
      blocks land on other SMs behind it), with the commit grid's commit blocks first. Again
      at 567ce2e (run 85, rank form, call by call): no misses 22.0-22.5 vs 27.4-27.9 us at
      batch 160, but 20% misses +39.8 / +43.5 us and cold +52.5 / +33.9 (656 / 1152 B).
      With the copy blocks first (they start beside the lookup instead of after it; the
      default since run 105) 20% misses at batch 160 gain instead: run 105 (8ebe4db, call
      by call against the old defaults) 656 B 1352.4 / 1360.1 vs 1460.4 / 1424.3 us, 1152 B
      1531.9 / 1538.1 vs 1548.5 / 1547.9, no misses 22.2-22.6 vs 26.7-27.2, cold 0.2-1.0%
      slower (656 B 4770-4846 vs 4761-4828). So auto takes it above the SM count. Its
      register sort holds
      8 keys per thread, all of B = 4096 (2d7f0b1; before, 4 per thread and the
      shared-memory sort above 2048 keys).

    Same results every way."""
    value = os.environ.get("DHISPARSE_LOOKUP_BLOCKS", "auto")
    if value != "auto" and value not in LOOKUP_SHAPES:
        raise InvalidArgument(
            f"DHISPARSE_LOOKUP_BLOCKS={value!r} must be one of {('auto', *LOOKUP_SHAPES)}"
        )
    if value == "auto":
        value = "2x512" if sms and batch > sms else "1"
    return LOOKUP_SHAPES[value]


def _count(var: str, limit: int) -> int:
    """``var`` = auto (0: the wrapper's rule) or an integer in [1, limit] in ASCII digits."""
    value = os.environ.get(var, "auto")
    if value == "auto":
        return 0
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= limit:
        raise InvalidArgument(f"{var}={value!r} must be auto or an integer in [1, {limit}]")
    return int(value)


def default_copy_blocks() -> int:
    """Copy blocks of ``commit``: ``DHISPARSE_COPY_BLOCKS`` = an integer >= 1, or auto (0:
    the kernel's rule, see ``commit``)."""
    return _count("DHISPARSE_COPY_BLOCKS", MAX_COPY_BLOCKS)


def default_copy_early() -> bool:
    """``DHISPARSE_COPY_EARLY`` (1 | 0, default 1): on the sync-free path, with the copy
    rule and sparse misses, the commit's first copy blocks issue their first round of host
    reads as soon as every request's misses are listed, before the lookup has chosen the
    victims (resolver_commit.cu ``preload``); 0 waits for the whole lookup grid first."""
    return _switch("DHISPARSE_COPY_EARLY", "1")


TMA_ROWS = 64  # resolver_tma.cuh TMA_WARPS * TMA_STAGES: a copy block's shared row buffers
TMA_SHARED_MAX = 96 * 1024  # their bytes at most (two commit blocks an SM)
COPY_TMA = ("0", "auto", "1")
COPY_TMA_DEFAULT = "auto"  # DHISPARSE_COPY_TMA unset (run 68, copy_tma)
TMA_MIN_ROWS = 8192  # copy_tma auto: calls copying fewer rows go by loads


def copy_tma(tma: bool | None, row_bytes: int, width: int, capability: tuple[int, int]) -> int:
    """From how many rows to copy (over every layer) ``commit`` copies the misses by the
    tensor memory accelerator (resolver_tma.cuh: one cp.async.bulk per row, host -> shared
    -> device) instead of 16-byte loads, -1 for never: ``tma``, else ``DHISPARSE_COPY_TMA`` =
    0 | auto | 1 (default auto). 1 (True): from 0 rows; auto: from TMA_MIN_ROWS rows, where
    the rows are whole 128-byte lines, except in a call with few sparse misses (at most 1024
    a request and 16384 in all, resolver_copy.cuh copy_few: by loads on more blocks, 1152 B
    rows at 20% misses and batch 32 in 315.7-320.7 us against 326.9-328.4 by TMA; H200,
    e94da73 / 4262cb8); 0 (False): never.

    It needs compute capability 9.0+, 16-byte rows (width 16) and TMA_ROWS rows of shared
    memory within TMA_SHARED_MAX (rows up to 1536 B). Isolated rows, address-sorted, read by
    a plain gather (H200, a0f94ab, ``bench.bench_host_gather --variants``, % of the pinned
    memcpy): 1152 B rows, 410 from each of 32 / 160 requests, 90-91% / 92% by TMA against
    86-88% / 84% by 16-byte loads (best grids); 656 B rows (not whole lines) 44-48% by TMA
    against 55-63%, so auto leaves them to the loads. Few rows go by loads too: ~410 (one
    request) cost a 1152 B call 37 against 34 us by TMA (cf41c5a). Same results every way.
    Asking for it where it cannot run is refused.

    In the resolver (H200, 8136b3c, same call, ``bench_resolver``, 1152 B rows, top_k 2048;
    loads / auto, run 68): 20% misses 331.2 / 331.2 us at batch 32, 1622.3 / 1563.7 at 160
    (84% / 87% of the memcpy); cold 1507.2 / 1503.1 and 7554.0 / 7432.7; no misses 13.1 /
    13.0, 13.6 / 14.5, 28.4 / 28.2 at batch 1 / 32 / 160. The host cannot know beforehand
    whether a call will miss (the sync-free path reads nothing between the launches), so
    every call of such rows launches the TMA kernel. Its preload by TMA is built only on
    request (``defines``: DHISPARSE_RESOLVER_TMA_PRELOAD=1): it reads 1152 B rows at 20%
    misses and batch 32 in 323-326 us, but its code alone makes calls without misses
    1.0-1.9 us slower (bench/resolver/tma_cost.py, 792ea08, run 67; before it, eff1103 /
    d07a4c9: neither the kernel's shared memory nor the carveout costs them)."""
    value = os.environ.get("DHISPARSE_COPY_TMA", COPY_TMA_DEFAULT) if tma is None else str(int(tma))
    name = "DHISPARSE_COPY_TMA" if tma is None else "tma"
    if value not in COPY_TMA:
        raise InvalidArgument(f"{name}={value!r} must be one of {COPY_TMA}")
    can = capability >= (9, 0) and width == 16 and row_bytes * TMA_ROWS <= TMA_SHARED_MAX
    if value == "1" and not can:
        raise InvalidArgument(
            f"{name}=1 needs compute capability >= 9.0 (got {capability[0]}.{capability[1]}), "
            f"rows of 16-byte vectors (got width {width}) and row_bytes <= "
            f"{TMA_SHARED_MAX // TMA_ROWS} (got {row_bytes})")
    if value == "1":
        return 0
    return TMA_MIN_ROWS if value == "auto" and can and row_bytes % 128 == 0 else -1


def default_commit_parts() -> int:
    """Commit blocks per request (``commit``'s ``parts``): ``DHISPARSE_COMMIT_PARTS`` = an
    integer in [1, MAX_COMMIT_PARTS], or auto (0: ``commit_parts_rule``)."""
    return _count("DHISPARSE_COMMIT_PARTS", MAX_COMMIT_PARTS)


COPY_BLOCKS_PER_SM = 2  # resolve_commit's __launch_bounds__(512, 2): 64 registers


def launched_copy_blocks(commit_blocks: int, sms: int) -> int:
    """Copy blocks the commit launches (the kernel puts its rule's share to work, see
    ``commit``): what the commit blocks leave of one wave of COPY_BLOCKS_PER_SM blocks per
    SM while that is at least 3/4 of the SM count, else one per SM. Every launched block
    waits for the lookup and sums the batch before it knows whether it copies, and blocks
    past one wave start only as others leave: a call without misses at batch 32 (128
    commit blocks) took 14.1 us with 136 copy blocks against 14.6 with 264 (H200, a52842b,
    1152 B, top_k 2048, same call; 13.6 with 16), while cold calls read within 1.5% of 264
    blocks' rate with 132 (186a8d1). At batch 160 (160 commit blocks) one per SM made 292
    blocks, past the wave; the 104 that fit it took 21.7-22.1 us without misses against
    22.3-22.6 with 132, cold 4812-4838 against 4835-4876, 20% misses within the spread
    (H200, e43d3aa, run 113, tma_cost auto_wave, call by call). More commit blocks than
    leave 3/4 of the SM count to copy keep one per SM (batch 256: not measured). At least
    one copy block, whatever the SM count."""
    left = COPY_BLOCKS_PER_SM * sms - commit_blocks
    return left if left >= max(1, 3 * sms // 4) else sms


def commit_parts_rule(batch: int, sms: int) -> int:
    """As many commit blocks per request as keep the commit blocks within one per SM (4 at
    most; 1 once the batch alone fills the SMs)."""
    return max(1, min(4, sms // max(batch, 1)))
