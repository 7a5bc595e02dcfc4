"""A request that cannot start fails alone: the others keep decoding and nothing leaks."""

from __future__ import annotations

import re

import pytest

from services.common.errors import InvalidArgument, ResourceExhausted
from services.decode.engine.engine import Engine
from services.decode.engine.request import GenerateSpec
from services.decode.hierarchy import InProcessBackingProvider
from tests.engine.harness import check_engine, pressured, prompts


class FullFor(InProcessBackingProvider):
    """A host store with no room for one request's histories."""

    def __init__(self, full: str) -> None:
        super().__init__()
        self.full = full

    def open(self, request_id: str, source_id: int, row_bytes: int, num_rows: int):
        if request_id == self.full:
            raise ResourceExhausted(f"history {request_id}/{source_id}: the kvstore is full")
        return super().open(request_id, source_id, row_bytes, num_rows)


def test_host_open_failure_fails_that_request_alone() -> None:
    provider = FullFor("r1")
    engine = Engine(pressured("hisparse", "glm"), provider=provider)
    slots = len(engine._free_slots)
    ended: dict[str, BaseException | None] = {}
    for i, prompt in enumerate(prompts(3)):
        engine.submit(GenerateSpec(f"r{i}", 6, prompt=prompt),
                      on_finish=lambda run: ended.__setitem__(run.request_id, run.error))
    while not engine.idle:
        engine.step()  # no exception escapes: the worker loop would treat it as fatal
        check_engine(engine)
    assert isinstance(ended.pop("r1"), ResourceExhausted)
    assert ended == {"r0": None, "r2": None}
    assert [r.request_id for r in engine.failed] == ["r1"]
    assert sorted(r.request_id for r in engine.finished) == ["r0", "r2"]
    assert len(engine._free_slots) == slots
    assert "r1" not in engine.admission.core.requests  # its grant went back
    assert not provider.histories


def test_any_uint64_sampling_seed_decodes() -> None:
    """The request's seed mixes with the worker's (seed * 1_000_003 + request seed): a seed
    near 2**64 wraps instead of overflowing torch's seeding on the engine thread (which
    the worker loop would take as fatal)."""
    import pytest

    from services.common.errors import InvalidArgument

    engine = Engine(pressured("hisparse", "glm", temperature=0.7, seed=1))
    engine.submit(GenerateSpec("big", 4, prompt=prompts(1)[0], seed=(1 << 64) - 1))
    engine.run_until_idle()
    assert [len(r.output) for r in engine.finished] == [4]
    with pytest.raises(InvalidArgument, match=r"seed=\d+: must be in \[0, 2\*\*64\)"):
        GenerateSpec("bad", 4, prompt=[1], seed=1 << 64)


def test_a_client_leaving_during_submit_cancels_its_request() -> None:
    """Generate awaits the engine thread's submit; a client gone meanwhile must still cancel
    the request (it may be queued already) instead of leaving it to run for nobody."""
    import asyncio

    from services.common.gen.dhisparse.v1 import decode_pb2 as pb
    from services.decode.servicer import DecodeServicer

    class SlowWorker:
        worker_id = "w"

        def __init__(self) -> None:
            self.cancelled: list[str] = []
            self.submitted = asyncio.Event()

        async def submit(self, spec):
            self.submitted.set()
            await asyncio.sleep(60)  # the engine thread is slow to answer

        def cancel(self, request_id: str) -> None:
            self.cancelled.append(request_id)

    async def body() -> list[str]:
        worker = SlowWorker()
        gen = DecodeServicer(worker).Generate(  # type: ignore[arg-type]
            pb.GenerateRequest(request_id="r", prompt_tokens=[1, 2], max_new_tokens=3), None)
        task = asyncio.ensure_future(gen.__anext__())
        await worker.submitted.wait()
        task.cancel()  # the client went away
        try:
            await task
        except asyncio.CancelledError:
            pass
        return worker.cancelled

    assert asyncio.run(body()) == ["r"]


def test_a_running_worker_keeps_no_finished_request() -> None:
    """A long-running worker holds no RequestRun after its stream ended (memory would grow
    with every request served)."""
    import asyncio

    from services.decode.config import DecodeConfig
    from services.decode.worker import DecodeWorker, Finished

    async def body() -> DecodeWorker:
        worker = DecodeWorker(DecodeConfig(worker_id="w", policy="hisparse"))
        worker.start()
        try:
            for i in range(3):
                stream = await worker.submit(GenerateSpec(f"r{i}", 3, prompt=[1, 2, 3]))
                while not isinstance(await stream.queue.get(), Finished):
                    pass
            await worker.status()  # one more pass of the engine loop
            assert worker.engine.stats.finished_requests == 3
            assert not worker.engine.finished and not worker.engine.failed
        finally:
            worker.close()
        return worker

    asyncio.run(body())


def test_sampling_with_speculation_off_draws_what_a_plain_worker_draws() -> None:
    """A request sent with speculation off (K_r = 1) to a speculative worker samples the same
    tokens as on a plain worker with the same seeds: its generator gives exactly the
    uniforms of its own K_r, not of the worker's K_max."""
    outs = {}
    for policy, block in (("resident", 0), ("resident-spec", 1)):
        engine = Engine(pressured(policy, "glm", pages=400, temperature=0.8, seed=1))
        for i, prompt in enumerate(prompts(3)):
            engine.submit(GenerateSpec(f"r{i}", 10, prompt=prompt, spec_block=block, seed=i))
        engine.run_until_idle()
        outs[policy] = {r.request_id: r.output for r in engine.finished}
    assert outs["resident"] == outs["resident-spec"]


def test_a_request_with_nothing_left_to_emit_runs_no_round() -> None:
    """max_new_tokens = 1: the token comes at activation; no decode round is run (or counted)
    for it."""
    engine = Engine(pressured("adaptive-spec", "glm", pages=400))
    engine.submit(GenerateSpec("one", 1, prompt=prompts(1)[0]))
    engine.run_until_idle()
    assert [len(r.output) for r in engine.finished] == [1]
    assert engine.stats.rounds == 0 and engine.stats.round_tokens == 0


def test_worker_wide_sampling_and_speculation_settings_are_restated_or_refused() -> None:
    """temperature, the speculation mode and the confidence threshold hold for the whole
    batch: a request may restate the engine's (a client's float32 0.3 included), another
    value is refused naming both, and nothing changes."""
    engine = Engine(pressured("adaptive-spec", "glm", pages=400, temperature=0.8, seed=1,
                              spec_mode="confidence"))
    p = prompts(1)[0]
    f32 = 0.30000001192092896  # 0.3 as a protobuf float arrives
    engine.submit(GenerateSpec("same", 3, prompt=p, temperature=0.800000011920929,
                               spec_mode="confidence", confidence_threshold=f32))
    bad = [
        (dict(temperature=0.0), "temperature=0.0: this worker samples at temperature=0.8"),
        (dict(spec_mode="fixed"), "mode='fixed': this worker speculates in mode 'confidence'"),
        (dict(confidence_threshold=0.5), "confidence_threshold=0.5: this worker speculates "
                                         "with confidence_threshold=0.3"),
    ]
    for kw, message in bad:
        with pytest.raises(InvalidArgument, match=re.escape(message)):
            engine.submit(GenerateSpec("other", 3, prompt=p, **kw))
    # speculation off for the request: the mode and threshold do not apply to it
    engine.submit(GenerateSpec("plain", 3, prompt=p, spec_block=1, spec_mode="fixed",
                               confidence_threshold=0.5))
    engine.run_until_idle()
    assert sorted(r.request_id for r in engine.finished) == ["plain", "same"]
    fixed = Engine(pressured("adaptive-spec", "glm", pages=400, spec_mode="fixed"))
    with pytest.raises(InvalidArgument, match="with mode 'fixed', no confidence threshold"):
        fixed.submit(GenerateSpec("t", 3, prompt=p, confidence_threshold=0.3))


def test_a_speculative_policy_with_blocks_of_one_does_not_refuse_speculation_settings() -> None:
    """K_max = 1 on a speculative policy drafts nothing: like a plain worker, it serves a
    request whatever speculation mode or threshold it names (found by a review)."""
    engine = Engine(pressured("adaptive-spec", "glm", pages=400, spec_block=1,
                              spec_mode="fixed"))
    engine.submit(GenerateSpec("c", 3, prompt=prompts(1)[0], spec_mode="confidence",
                               confidence_threshold=0.5))
    engine.run_until_idle()
    assert [r.request_id for r in engine.finished] == ["c"]


def test_a_request_too_short_to_draft_does_not_refuse_speculation_settings() -> None:
    """The first token comes from prefill, so a request of max_new_tokens <= 2 never has
    a round with K_r > 1: the worker's mode and threshold do not apply to it; one token
    longer, they do."""
    engine = Engine(pressured("adaptive-spec", "glm", pages=400, spec_mode="fixed"))
    p = prompts(1)[0]
    for n in (1, 2):
        engine.submit(GenerateSpec(f"short{n}", n, prompt=p, spec_mode="confidence",
                                   confidence_threshold=0.5))
    with pytest.raises(InvalidArgument, match="mode='confidence': this worker speculates"):
        engine.submit(GenerateSpec("long", 3, prompt=p, spec_mode="confidence"))
    engine.run_until_idle()
    assert sorted(r.request_id for r in engine.finished) == ["short1", "short2"]
    assert engine.stats.round_tokens == 1  # short2's one round: no drafted token


def test_a_request_id_too_long_for_the_stores_is_refused_at_submit() -> None:
    """The worker prefixes the client's id; an id that would pass the kvstore's limit only
    with the prefix is refused before admission, naming the client's length and the limit,
    and an id at the limit decodes."""
    import asyncio

    from services.common.errors import InvalidArgument
    from services.decode.config import DecodeConfig
    from services.decode.worker import DecodeWorker, Finished
    from services.kvstore.keys import MAX_ID_LEN

    async def body() -> None:
        worker = DecodeWorker(DecodeConfig(worker_id="w", policy="hisparse"))
        worker.start()
        try:
            limit = MAX_ID_LEN - len(f"w.{worker.incarnation}.1:")
            with pytest.raises(InvalidArgument, match=f"has {limit + 1} characters; the limit "
                                                      f"on worker w is {limit}"):
                await worker.submit(GenerateSpec("x" * (limit + 1), 3, prompt=[1, 2, 3]))
            stream = await worker.submit(GenerateSpec("y" * limit, 3, prompt=[1, 2, 3]))
            while not isinstance(item := await stream.queue.get(), Finished):
                assert not isinstance(item, BaseException), item
        finally:
            worker.close()

    asyncio.run(body())
