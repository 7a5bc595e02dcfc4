"""``dhisparse load``: a closed-loop workload client against running decode workers.

C requests are kept in flight: each finished request is replaced by a new one until
``requests`` have been issued. Requests go to the workers round-robin (each worker then
admits through the residency controller, which decides whether it fits now or waits).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import grpc

from services.common.gen.dhisparse.v1 import decode_pb2, decode_pb2_grpc
from services.common.interceptors import token_metadata


@dataclass(slots=True)
class LoadSettings:
    targets: list[str]
    concurrency: int = 4
    requests: int = 16
    input_len: int = 64
    output_len: int = 16
    speculation: bool = False
    spec_block: int = 4
    prefix_id: str = ""
    seed: int = 0
    vocab: int = 64
    token: str | None = None
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        for name in ("concurrency", "requests", "input_len", "output_len", "spec_block"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')}={getattr(self, name)}: must be > 0")
        if not self.targets:
            raise ValueError("--targets: at least one decode worker address is needed")


@dataclass(slots=True)
class RequestResult:
    request_id: str
    worker_id: str
    tokens: list[int]
    ttft_s: float
    latency_s: float
    admission_wait_s: float
    error: str = ""

    @property
    def tpot_s(self) -> float:
        n = len(self.tokens)
        return (self.latency_s - self.ttft_s) / (n - 1) if n > 1 else 0.0


@dataclass(slots=True)
class LoadReport:
    settings: LoadSettings
    results: list[RequestResult] = field(default_factory=list)
    wall_s: float = 0.0

    def summary(self) -> dict[str, float]:
        ok = [r for r in self.results if not r.error]
        ttft = sorted(r.ttft_s for r in ok) or [0.0]
        out = sum(len(r.tokens) for r in ok)
        return {
            "requests_ok": len(ok),
            "requests_failed": len(self.results) - len(ok),
            "output_tokens": out,
            "output_tokens_per_s": out / self.wall_s if self.wall_s else 0.0,
            "ttft_mean_s": statistics.fmean(ttft),
            "ttft_p99_s": ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))],
            "tpot_mean_s": statistics.fmean([r.tpot_s for r in ok]) if ok else 0.0,
            "admission_wait_mean_s": statistics.fmean([r.admission_wait_s for r in ok])
            if ok else 0.0,
            "wall_s": self.wall_s,
        }

    def to_json(self) -> dict[str, object]:
        return {"settings": asdict(self.settings) | {"token": None},
                "summary": self.summary(),
                "requests": [asdict(r) for r in self.results]}


def make_prompt(rng: random.Random, settings: LoadSettings) -> list[int]:
    return [rng.randrange(settings.vocab) for _ in range(settings.input_len)]


async def _one(stub: decode_pb2_grpc.DecodeStub, request_id: str, prompt: Sequence[int],
               settings: LoadSettings) -> RequestResult:
    # the mode is the worker's (MODE_UNSPECIFIED): a worker refuses a request asking another
    spec = decode_pb2.SpeculationSettings(enabled=settings.speculation, block=settings.spec_block)
    req = decode_pb2.GenerateRequest(
        request_id=request_id, prompt_tokens=[] if settings.prefix_id else list(prompt),
        prefix_id=settings.prefix_id, max_new_tokens=settings.output_len, speculation=spec)
    start = time.perf_counter()
    tokens: list[int] = []
    ttft = wait = 0.0
    worker = ""
    try:
        async for reply in stub.Generate(req, timeout=settings.timeout_s,
                                         metadata=token_metadata(settings.token)):
            if not tokens and reply.tokens:
                ttft = time.perf_counter() - start
                wait = reply.admission_wait_s
                worker = reply.worker_id
            tokens.extend(t.token_id for t in reply.tokens)
    except grpc.aio.AioRpcError as exc:
        return RequestResult(request_id, worker, tokens, ttft, time.perf_counter() - start,
                             wait, error=f"{exc.code().name}: {exc.details()}")
    return RequestResult(request_id, worker, tokens, ttft, time.perf_counter() - start, wait)


async def run_load(settings: LoadSettings, on_done=None) -> LoadReport:
    """Run the closed loop; ``on_done(result)`` is called as each request finishes."""
    rng = random.Random(settings.seed)
    prompts = [make_prompt(rng, settings) for _ in range(settings.requests)]
    channels = [grpc.aio.insecure_channel(t) for t in settings.targets]
    stubs = [decode_pb2_grpc.DecodeStub(c) for c in channels]
    report = LoadReport(settings)
    next_index = 0

    async def lane() -> None:
        nonlocal next_index
        while next_index < settings.requests:
            i = next_index
            next_index += 1
            result = await _one(stubs[i % len(stubs)], f"load-{settings.seed}-{i}",
                                prompts[i], settings)
            report.results.append(result)
            if on_done is not None:
                on_done(result)

    start = time.perf_counter()
    try:
        await asyncio.gather(*(lane() for _ in range(settings.concurrency)))
    finally:
        report.wall_s = time.perf_counter() - start
        for c in channels:
            await c.close()
    report.results.sort(key=lambda r: int(r.request_id.rsplit("-", 1)[1]))
    return report
