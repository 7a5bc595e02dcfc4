"""Chaos on a real cluster: kill -9 of the kvstore, the residency controller or one
decode worker while requests decode. Tokens must equal in-process resident serving."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from tests.cluster import harness as h

pytestmark = pytest.mark.integration

N, MAX_NEW = 6, 120


def _prompts(seed: int) -> list[list[int]]:
    return [h.prompt(seed + i, 70 + 5 * i) for i in range(N)]


def _start_and_kill(pool, cluster, prompts, tag, kill, after_tokens=6, targets=None):
    """Start generating ``prompts`` concurrently on ``pool``; call ``kill()`` once the first
    stream has ``after_tokens`` tokens. Returns (futures, tokens every stream had at the
    kill: filled once ``fired`` is set, fired)."""
    targets = targets or cluster.plan.decode_targets
    once = threading.Lock()
    fired = threading.Event()
    progress = [0] * len(prompts)
    at_kill: list[int] = []

    def on_token(i: int, n: int) -> None:
        progress[i] = n
        if n >= after_tokens and once.acquire(blocking=False):
            at_kill.extend(progress)
            kill()
            fired.set()

    futs = [pool.submit(h.generate, targets[i % len(targets)], f"{tag}-{i}", p, MAX_NEW,
                        on_token=lambda n, i=i: on_token(i, n))
            for i, p in enumerate(prompts)]
    return futs, at_kill, fired


def _run_and_kill(cluster, prompts, tag, kill, after_tokens=6, targets=None):
    """``_start_and_kill``, then every stream's result. Returns (results, tokens every
    stream had at the kill)."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        futs, at_kill, _ = _start_and_kill(pool, cluster, prompts, tag, kill, after_tokens,
                                           targets)
        return [f.result() for f in futs], at_kill


def test_kvstore_kill9_is_restarted_and_decoding_loses_no_token(tmp_path) -> None:
    prompts = _prompts(10)
    with h.start(tmp_path) as cluster:
        sup = cluster.supervisor
        old_pid = sup.pid("kvstore")
        results, at_kill = _run_and_kill(cluster, prompts, "kv", lambda: sup.kill("kvstore"))
        assert at_kill and max(at_kill) < MAX_NEW, "the kill did not land mid-run"
        assert [r.error for r in results] == [None] * N
        assert [r.tokens for r in results] == h.reference(prompts, MAX_NEW)
        assert sup.restarts("kvstore") == 1 and sup.pid("kvstore") != old_pid
        # the restarted store serves new requests too
        again = h.generate_many(cluster, prompts[:2], 16, "kv-after")
        assert [r.tokens for r in again] == h.reference(prompts[:2], 16)


def test_residency_kill9_workers_keep_decoding_and_admissions_resume(tmp_path) -> None:
    prompts = _prompts(20)
    with h.start(tmp_path) as cluster, ThreadPoolExecutor(N) as pool:
        sup = cluster.supervisor
        sup.set_restart("residency", False)
        futs, at_kill, fired = _start_and_kill(pool, cluster, prompts, "res",
                                               lambda: sup.kill("residency"))
        assert fired.wait(120), "no stream reached the kill"
        assert max(at_kill) < MAX_NEW, "the kill did not land mid-run"
        # every running request finishes while the controller is down; one still waiting
        # for admission at the kill waits for the restart (it cannot be admitted before)
        running = [i for i, n in enumerate(at_kill) if n > 0]
        assert running, at_kill
        assert [futs[i].result().error for i in running] == [None] * len(running)
        assert not sup.alive("residency")
        # a request submitted while it is down waits, then is admitted after the restart
        late: list[h.Result] = []
        t = threading.Thread(target=lambda: late.append(
            h.generate(cluster.plan.decode_targets[0], "res-late", prompts[0], 16)))
        t.start()
        t.join(1.0)
        assert t.is_alive(), "admitted without a controller"
        sup.set_restart("residency", True)
        t.join(60)
        assert late and late[0].error is None
        assert late[0].tokens == h.reference([prompts[0]], 16)[0]
        results = [f.result() for f in futs]
        assert [r.error for r in results] == [None] * N
        assert [r.tokens for r in results] == h.reference(prompts, MAX_NEW)
        state = h.wait_for(lambda: (s := h.residency_state(cluster)) and
                           {w.worker_id for w in s.workers if w.alive} ==
                           {"decode-0", "decode-1"} and s, 20, "both workers re-registered")
        assert state.epoch and sup.restarts("residency") == 1
        again = h.generate_many(cluster, prompts, 12, "res-after")
        assert [r.tokens for r in again] == h.reference(prompts, 12)


def test_worker_kill9_others_serve_histories_expire_and_residency_drops_it(tmp_path) -> None:
    prompts = _prompts(30)
    with h.start(tmp_path, lease_s=2.0, heartbeat_timeout_s=2.0) as cluster:
        sup = cluster.supervisor
        sup.set_restart("decode-1", False)
        held: list = []

        def kill() -> None:
            held.extend(h.kvstore_histories(cluster, "decode-1."))
            sup.kill("decode-1")

        results, at_kill = _run_and_kill(cluster, prompts, "wk", kill)
        assert at_kill and max(at_kill) < MAX_NEW, "the kill did not land mid-run"
        assert held, "decode-1 held no kvstore history when it was killed"
        on_0 = [r for i, r in enumerate(results) if i % 2 == 0]
        on_1 = [r for i, r in enumerate(results) if i % 2 == 1]
        assert [r.error for r in on_0] == [None] * len(on_0)
        assert [r.tokens for r in on_0] == h.reference(prompts[0::2], MAX_NEW)
        assert all(r.error is not None and r.error.code().name == "UNAVAILABLE"
                   for r in on_1 if len(r.tokens) < MAX_NEW)
        h.wait_for(lambda: not h.kvstore_histories(cluster, "decode-1."), 20,
                   "decode-1's kvstore histories to expire with their lease")
        h.wait_for(lambda: "decode-1" not in {w.worker_id for w in
                                              h.residency_state(cluster).workers}, 20,
                   "residency to drop decode-1")
        assert sup.restarts("decode-1") == 0
        target = cluster.plan.decode_targets[0]
        again = [h.generate(target, f"wk-after-{i}", p, 12) for i, p in enumerate(prompts[:3])]
        assert [r.tokens for r in again] == h.reference(prompts[:3], 12)


def test_restarted_residency_rebuilds_its_ledger_from_live_requests(tmp_path) -> None:
    """kill -9 of the controller while long requests decode: it is restarted, the workers
    re-register with their live requests, and the new controller's ledger lists them
    (soft state rebuilt from reports) before they finish; no token changes."""
    prompts, max_new = [h.prompt(40 + i, 60 + 4 * i) for i in range(4)], 1200
    with h.start(tmp_path, max_context=1300) as cluster:
        sup = cluster.supervisor
        targets = cluster.plan.decode_targets
        tokens = [0] * len(prompts)
        killed = threading.Event()

        def on_token(i: int, n: int) -> None:
            tokens[i] = n
            if n >= 6 and not killed.is_set():
                killed.set()
                sup.kill("residency")

        with ThreadPoolExecutor(len(prompts)) as pool:
            futs = [pool.submit(h.generate, targets[i % len(targets)], f"rb-{i}", p, max_new,
                                on_token=lambda n, i=i: on_token(i, n))
                    for i, p in enumerate(prompts)]
            assert killed.wait(60), "no stream reached the kill point"

            def rebuilt():
                try:
                    state = h.residency_state(cluster)
                except grpc.RpcError:
                    return None
                live = [r for w in state.workers if w.alive for r in w.requests]
                return state if len(live) == len(prompts) else None

            state = h.wait_for(rebuilt, 30, "the restarted controller to list every live request")
            assert sup.restarts("residency") == 1
            assert not all(f.done() for f in futs), "requests finished before the rebuild"
            assert min(tokens) < max_new
            by_worker = {w.worker_id: len(w.requests) for w in state.workers}
            assert by_worker == {"decode-0": 2, "decode-1": 2}
            results = [f.result() for f in futs]
        assert [r.error for r in results] == [None] * len(prompts)
        assert [r.tokens for r in results] == h.reference(prompts, max_new)
        done = h.wait_for(lambda: (s := h.residency_state(cluster)) and
                          not any(w.requests for w in s.workers) and s, 20,
                          "the rebuilt ledger to release the finished requests")
        assert all(w.required_pages == 0 for w in done.workers)
