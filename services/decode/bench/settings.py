"""Benchmark settings: the flag contract of ``dhisparse bench serve`` / ``bench load-step``.

Every field is a flag (``input_len`` ↔ ``--input-len``). ``validate`` checks what
``EngineConfig`` does not (sizes, lists, the whole request fitting the budget under every
policy, the context limit) and builds one ``EngineConfig`` per policy so its own checks
run before any timing starts. Errors are ``InvalidArgument`` naming flag, value and limit.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

from services.common.config import parse_size
from services.common.errors import InvalidArgument
from services.decode.engine.config import EngineConfig
from services.decode.engine.policies import POLICIES, get_policy

ALL_POLICIES = tuple(POLICIES)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
"""``wall``: real elapsed time (the paper's measure). ``cpu``: this process's CPU time, for a
shared machine where other tenants' load would otherwise show up as our latency; with one
torch thread the whole decode loop runs on this thread, so it is the work we did."""
LOAD_STEP_POLICIES = ("adaptive", "hisparse")  # residency on / off


def parse_int_list(flag: str, value: str | list[int] | tuple[int, ...]) -> list[int]:
    """``"1,2,4"`` → ``[1, 2, 4]``; every entry a positive integer."""
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for item in items:
        try:
            n = int(str(item).strip())
        except ValueError:
            raise InvalidArgument(f"--{flag}={value!r}: {item!r} is not an integer") from None
        if n < 1:
            raise InvalidArgument(f"--{flag}={value!r}: every entry must be an integer >= 1")
        out.append(n)
    if not out:
        raise InvalidArgument(f"--{flag}={value!r}: give at least one value")
    return out


def parse_policies(value: str | list[str] | tuple[str, ...]) -> list[str]:
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [s.strip() for s in items if s.strip()]
    if not names:
        raise InvalidArgument(f"--policy={value!r}: expected one of {', '.join(POLICIES)}")
    for name in names:
        get_policy(name)
    if len(set(names)) != len(names):
        raise InvalidArgument(f"--policy={value!r}: a policy is listed twice")
    return names


def _positive(flag: str, value: object, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidArgument(f"--{flag}={value!r}: must be an integer >= {minimum}")


@dataclass(slots=True)
class BenchSettings:
    """Workload and engine flags shared by both benchmarks.

    Defaults are the CPU demo sized for ~1 minute on 2 cores: the ``demo`` model (k = 32),
    512-token inputs, B = 2k = 64 hot rows, 16-row pages and a 2 MiB KV budget (256 pages
    of 8 KiB). A resident session of 512 + 32 tokens holds 37 pages, so at most 6 fit;
    an offloaded one holds 6 (tail + hot cache), so 16 fit with room for optional history
    of the first few (32 pages each): residency stops fitting between C4 and C8.
    """

    policy: str = ",".join(ALL_POLICIES)
    concurrency: str = "2,4,8,16"
    input_len: int = 512
    output_len: int = 32
    output_range_ratio: float = 1.0
    requests: int = 24
    hot_cache: int = 64
    top_k: int | None = None
    kv_memory: str = "2MiB"
    topology: str = "glm"
    spec_block: int = 4
    seed: int = 0
    batch_invariant: bool = False
    device: str = "cpu"
    preset: str = "demo"
    page_rows: int = 16
    max_context: int = 4096
    prefixes: int = 1
    populate_pages: int = 4
    clock: str = "wall"
    policies: list[str] = field(default_factory=list, init=False)
    concurrencies: list[int] = field(default_factory=list, init=False)

    def validate(self) -> BenchSettings:
        """Check every flag; raises ``InvalidArgument`` naming the first bad one."""
        self.policies = parse_policies(self.policy)
        self.concurrencies = parse_int_list("concurrency", self.concurrency)
        for flag in ("input_len", "output_len", "requests", "hot_cache", "spec_block",
                     "page_rows", "max_context", "prefixes", "populate_pages"):
            _positive(flag.replace("_", "-"), getattr(self, flag))
        _positive("seed", self.seed, 0)
        if not 0 < self.output_range_ratio <= 1:
            raise InvalidArgument(f"--output-range-ratio={self.output_range_ratio}: must lie "
                                  "in (0, 1]")
        if self.top_k is not None:
            _positive("top-k", self.top_k)
        if self.topology not in ("glm", "deepseek"):
            raise InvalidArgument(f"--topology={self.topology!r}: expected glm or deepseek")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise InvalidArgument(f"--device={self.device!r}: expected cpu or cuda")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise InvalidArgument(f"--device={self.device!r}: no CUDA device is available")
        if self.clock not in CLOCKS:
            raise InvalidArgument(f"--clock={self.clock!r}: expected wall or cpu")
        if self.clock == "cpu" and self.device != "cpu":
            raise InvalidArgument(f"--clock=cpu: needs --device=cpu (GPU time is not CPU time), "
                                  f"got --device={self.device!r}")
        parse_size(self.kv_memory, "--kv-memory")
        self._check_schedule()
        for name in self.policies:
            self.check_fits(name)
        return self

    def _check_schedule(self) -> None:
        if self.requests < max(self.concurrencies):
            raise InvalidArgument(
                f"--requests={self.requests}: must be >= the largest --concurrency="
                f"{max(self.concurrencies)} (otherwise that load is never offered)")

    def engine_config(self, policy: str, slots: int) -> EngineConfig:
        """The engine of one run: ``slots`` request slots (N), everything else from flags."""
        return EngineConfig(
            policy=policy, preset=self.preset, kv_memory=self.kv_memory,
            hot_cache=self.hot_cache, top_k=self.top_k, page_rows=self.page_rows,
            max_requests=slots, max_context=self.max_context, spec_block=self.spec_block,
            topology=self.topology, batch_invariant=self.batch_invariant,
            device=self.device, seed=self.seed, populate_pages=self.populate_pages)

    def max_rows(self, cfg: EngineConfig) -> int:
        return self.input_len + self.output_len + cfg.k_max

    def check_fits(self, policy: str) -> EngineConfig:
        """One whole request must fit the context limit and the budget under ``policy``
        (else it would wait for admission forever)."""
        cfg = self.engine_config(policy, max(self.concurrencies))
        rows = self.max_rows(cfg)
        if rows > self.max_context:
            raise InvalidArgument(
                f"--input-len={self.input_len} + --output-len={self.output_len} + K_max="
                f"{cfg.k_max} = {rows} exceeds --max-context={self.max_context}")
        need = cfg.required_pages_for(rows) + cfg.reserve_pages
        if need > cfg.num_pages:
            raise InvalidArgument(
                f"--kv-memory={self.kv_memory}: {cfg.num_pages} pages of {cfg.page_bytes} B "
                f"are fewer than the {need} pages ({need * cfg.page_bytes} B) one {policy} "
                f"request of {rows} rows holds")
        return cfg

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(slots=True)
class LoadStepSettings(BenchSettings):
    """``bench load-step``: ``concurrency`` is the phase schedule (C_low, C_high, C_low);
    each phase lasts ``phase_seconds`` or, when set, ``phase_requests`` submissions."""

    policy: str = ",".join(LOAD_STEP_POLICIES)
    concurrency: str = "4,16,4"
    phase_seconds: float = 5.0
    phase_requests: int | None = None

    def _check_schedule(self) -> None:
        if not self.phase_seconds > 0:
            raise InvalidArgument(f"--phase-seconds={self.phase_seconds}: must be > 0")
        if self.phase_requests is not None:
            _positive("phase-requests", self.phase_requests)
