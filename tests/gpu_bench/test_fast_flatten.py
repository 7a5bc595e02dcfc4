"""``FastDSAModel._flatten_host`` = ``DSAModel._flatten`` (same queries, same errors) from
one device→host read."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import InvalidArgument
from services.decode.model.config import preset
from services.decode.model.fast import FastDSAModel


def _model() -> FastDSAModel:
    return FastDSAModel(preset("tiny"), slots=8, max_positions=64)


def test_flatten_host_matches_reference() -> None:
    m = _model()
    tokens = torch.tensor([[1, 2, 3], [4, 0, 0], [5, 6, 0]])
    n, nq, slots = torch.tensor([7, 3, 10]), torch.tensor([3, 1, 2]), torch.tensor([5, 0, 2])
    ref = m._flatten(tokens, n, nq, slots)
    f, host = m._flatten_host(tokens, n, nq, slots)
    for name in ("b", "j", "slot", "pos"):
        assert torch.equal(getattr(f, name), getattr(ref, name)), name
    assert host.slots == [5, 0, 2] and host.slots_t is slots
    assert host.start == {0: 7, 1: 3, 2: 10} and host.stop == {0: 10, 1: 4, 2: 12}
    assert host.key_stop == 12


@pytest.mark.parametrize("case", ["nq", "n", "tokens"])
def test_flatten_host_rejects_what_the_reference_rejects(case: str) -> None:
    m = _model()
    tokens, n, nq = torch.tensor([[1, 2], [3, 4]]), torch.tensor([1, 2]), torch.tensor([2, 1])
    if case == "nq":
        nq = torch.tensor([0, 1])
    elif case == "n":
        n = torch.tensor([-1, 2])
    else:
        tokens = torch.tensor([[1, 2], [3, 999]])
        nq = torch.tensor([2, 2])
    slots = torch.tensor([0, 1])
    with pytest.raises(InvalidArgument) as ref:
        m._flatten(tokens, n, nq, slots)
    with pytest.raises(InvalidArgument) as got:
        m._flatten_host(tokens, n, nq, slots)
    assert str(got.value) == str(ref.value)
