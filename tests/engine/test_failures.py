"""A request that cannot start fails alone: the others keep decoding and nothing leaks."""

from __future__ import annotations

from services.common.errors import ResourceExhausted
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
