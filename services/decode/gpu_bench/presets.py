"""The ``h200`` preset of the serving benchmarks (paper §4 at one H200) and its CPU twin.

Sizing (h200-deepseek model: 8 source groups of 4 layers, 656 B FP8-MLA rows, k = 2048;
64-row pages = 64 · 8 · 656 B = 328 KiB per ledger page)::

    resident session, 32K input + 32 output   516 pages = 169 MiB
    offloaded session, B = 4096 (2k)           66 pages =  21 MiB   (tail 2 + hot 64)
    KV budget M = 2560 MiB = 7,989 pages  →  15 resident sessions, 121 offloaded

so resident histories stop fitting between C8 and C16 while hisparse/adaptive keep
admitting through C64 (the paper's crossover), the same M for every policy. Adaptive
keeps every history on the GPU at C4 (4 · (66 + 512) pages) and only a few at C64.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from services.decode.bench.settings import BenchSettings, LoadStepSettings

H200_INPUT = 32_768


@dataclass(slots=True)
class Plan:
    """Everything one sweep runs; ``serve``/``load_step`` are the CPU bench's settings."""

    serve: BenchSettings
    load_step: LoadStepSettings
    hot_caches: list[int] = field(default_factory=list)     # B values (k … 8k) besides
    #                                                         the serve sweep's own B
    hot_loads: list[int] = field(default_factory=list)      # C values of the B sweep
    hot_policies: list[str] = field(default_factory=lambda: ["hisparse", "adaptive"])
    profile_concurrency: tuple[int, ...] = (4, 32)  # one-step profiles at low and high load
    profile_policies: list[str] = field(
        default_factory=lambda: ["hisparse", "adaptive", "adaptive-spec"])
    requests_per_c: float = 2.0      # requests per serve point = max(C, factor · C, min)
    min_requests: int = 0            # floor: low-C points long enough to compare
    low_phase_requests: int = 8      # load step: submissions in each C_low phase
    high_phase_requests: int = 64    # ... and in the C_high phase
    point_s: float | None = None     # wall cap of one serve point / load-step arm

    def requests(self, c: int) -> int:
        return max(c, int(self.requests_per_c * c), self.min_requests)


def _common(device: str, preset: str, input_len: int, output_len: int, hot: int,
            kv: str, page: int, conc: str) -> dict[str, object]:
    return dict(device=device, preset=preset, topology="deepseek", input_len=input_len,
                output_len=output_len, hot_cache=hot, kv_memory=kv, page_rows=page,
                max_context=input_len + output_len + 8, prefixes=4, spec_block=4,
                concurrency=conc)


H200_CONCURRENCY = "4,8,16,32,64,128"


def h200_plan(output_len: int = 24, concurrency: str = H200_CONCURRENCY,
              point_s: float | None = 45.0) -> Plan:
    """``dhisparse bench serve|load-step --device cuda --preset h200``."""
    c = _common("cuda", "h200-deepseek", H200_INPUT, output_len, 4096, "2560MiB", 64,
                concurrency)
    serve = BenchSettings(**c, requests=2 * max(int(x) for x in concurrency.split(",")))
    step = LoadStepSettings(**{**c, "concurrency": "4,32,4"}, policy="adaptive,hisparse",
                            phase_requests=8)
    return Plan(serve, step, hot_caches=[2048, 8192, 16384], hot_loads=[4, 32],
                requests_per_c=1.5, min_requests=16, point_s=point_s)


def cpu_plan() -> Plan:
    """The same sweep on the CPU ``demo`` model (k = 32): a dry run of every code path."""
    c = _common("cpu", "demo", 512, 12, 64, "1MiB", 16, "2,4,8")
    serve = BenchSettings(**c, requests=16)
    step = LoadStepSettings(**{**c, "concurrency": "2,8,2"}, policy="adaptive,hisparse",
                            phase_requests=4)
    return Plan(serve, step, hot_caches=[32, 64], hot_loads=[2, 8], profile_concurrency=(2, 4),
                high_phase_requests=8)


def with_hot_cache(settings: BenchSettings, hot: int) -> BenchSettings:
    """A copy of ``settings`` with hot cache B = ``hot`` (validated)."""
    return dataclasses.replace(settings, hot_cache=hot).validate()
