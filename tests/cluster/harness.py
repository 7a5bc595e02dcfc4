"""A real local cluster for the integration tests: kvstore + residency + decode workers
as supervised processes (``services.cli.cluster``), a sync Generate client, and the
in-process reference (resident serving) that cluster tokens must equal."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from services.cli.cluster import Cluster, ClusterSettings, plan_cluster, scrape, start_cluster
from services.common.gen.dhisparse.v1 import decode_pb2 as pb
from services.common.gen.dhisparse.v1 import decode_pb2_grpc, residency_pb2_grpc
from services.common.gen.dhisparse.v1 import residency_pb2 as rpb
from services.kvstore.rpc import KVStoreRPC

# Tiny model, small pages: several pages of history per request, backups every 8 tokens.
SETTINGS = dict(workers=2, policy="adaptive", preset="tiny", kv_memory="96KiB",
                capacity="64MiB", max_requests=6, max_context=256, hot_cache=8, page_rows=8,
                batch_invariant=True, prefixes="sys=40:3")


class Settings(ClusterSettings):
    def kv_memory_pages(self) -> int:
        """Pages of one worker's KV pool under these settings."""
        from services.decode.engine.config import EngineConfig
        return EngineConfig(policy=self.policy, preset=self.preset, kv_memory=self.kv_memory,
                            hot_cache=self.hot_cache, page_rows=self.page_rows,
                            max_requests=self.max_requests,
                            max_context=self.max_context).num_pages


def make_settings(**overrides: Any) -> Settings:
    return Settings(**{**SETTINGS, **overrides})


def start(tmp_path: Path, **overrides: Any) -> Cluster:
    plan = plan_cluster(tmp_path / "cluster", make_settings(**overrides), shm_root=tmp_path)
    return start_cluster(plan, timeout_s=120)


def prompt(i: int, length: int) -> list[int]:
    return [(7 * i + 3 * j + j * j) % 64 for j in range(length)]


@dataclass
class Result:
    tokens: list[int] = field(default_factory=list)
    worker: str = ""
    indices: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    ttft: float = 0.0
    finish: int = 0
    error: grpc.RpcError | None = None


def generate(target: str, request_id: str, tokens: Sequence[int] = (), max_new: int = 16,
             prefix_id: str = "", spec: pb.SpeculationSettings | None = None,
             timeout: float = 120.0, on_token: Callable[[int], None] | None = None) -> Result:
    out = Result()
    req = pb.GenerateRequest(request_id=request_id, prompt_tokens=list(tokens),
                             prefix_id=prefix_id, max_new_tokens=max_new, speculation=spec)
    with grpc.insecure_channel(target) as ch:
        try:
            for i, msg in enumerate(decode_pb2_grpc.DecodeStub(ch).Generate(req,
                                                                            timeout=timeout)):
                if i == 0:
                    out.ttft, out.worker = msg.ttft_s, msg.worker_id
                for e in msg.tokens:
                    out.tokens.append(e.token_id)
                    out.indices.append(e.index)
                    out.times.append(e.time_s)
                    if on_token is not None:
                        on_token(len(out.tokens))
                out.finish = msg.finish_reason or out.finish
        except grpc.RpcError as exc:
            out.error = exc
    return out


def generate_many(cluster: Cluster, prompts: list[list[int]], max_new: int, tag: str,
                  **kw: Any) -> list[Result]:
    """Concurrent Generate calls, round-robin over the workers."""
    targets = cluster.plan.decode_targets
    with ThreadPoolExecutor(len(prompts)) as pool:
        futs = [pool.submit(generate, targets[i % len(targets)], f"{tag}-{i}", p, max_new,
                            **kw) for i, p in enumerate(prompts)]
        return [f.result() for f in futs]


def reference(prompts: list[list[int]], max_new: int, prefix: list[int] | None = None
              ) -> list[list[int]]:
    """Greedy tokens of in-process resident serving (same preset and seed)."""
    import torch

    from services.decode.engine.config import EngineConfig
    from services.decode.engine.engine import Engine
    from services.decode.engine.request import GenerateSpec

    torch.set_num_threads(1)
    longest = max((len(p) for p in prompts), default=0) + max_new + 1
    context = max(256, -(-longest // 8) * 8)
    cfg = EngineConfig(policy="resident", preset=SETTINGS["preset"],
                       kv_memory=max(4 << 20, 2 * len(prompts) * context * 1024),
                       hot_cache=8, page_rows=8, max_requests=len(prompts) or 1,
                       max_context=context, batch_invariant=True)
    engine = Engine(cfg)
    outs: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        engine.submit(GenerateSpec(f"r{i}", max_new, prompt=p),
                      on_finish=lambda run: outs.__setitem__(run.request_id, run.output))
    engine.run_until_idle()
    return [outs[f"r{i}"] for i in range(len(prompts))]


def prefix_tokens(length: int, seed: int) -> list[int]:
    """The tokens ``--prefixes name=length:seed`` prefills (see DecodeWorker)."""
    import torch

    return torch.randint(64, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def metrics(cluster: Cluster, name: str) -> dict:
    return scrape(f"http://127.0.0.1:{cluster.plan.spec(name).metrics_port}/metrics")


def residency_state(cluster: Cluster) -> rpb.GetStateResponse:
    port = cluster.plan.spec("residency").port
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        return residency_pb2_grpc.ResidencyStub(ch).GetState(
            rpb.GetStateRequest(include_requests=True), timeout=5)


def kvstore_histories(cluster: Cluster, owner_prefix: str = "") -> list[Any]:
    rpc = KVStoreRPC(f"127.0.0.1:{cluster.plan.spec('kvstore').port}")
    try:
        stats = rpc.stats(include_histories=True)
    finally:
        rpc.close_channel()
    return [h for h in stats.history if h.owner.startswith(owner_prefix)]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def log_lines(cluster: Cluster, *needles: str, limit: int = 60) -> str:
    """Every process log's lines naming one of ``needles`` (request ids), plus its warnings:
    what a failing chaos test prints, so a CI failure shows the cluster's side of it."""
    out = []
    for path in sorted((cluster.plan.state_dir / "logs").glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if any(n in line for n in needles) or any(
                    m in line for m in (" WARNING ", " ERROR ", "Traceback", "Exception")):
                out.append(f"{path.stem}: {line}")
    return "\n".join(out[-limit:])
