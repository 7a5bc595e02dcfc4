"""Repository-wide pytest setup: the ``gpu`` marker skips itself without a CUDA device."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _one_intra_op_thread():
    """One torch intra-op thread per test (restored after): the reference model runs many
    tiny ops, and on a loaded 2-core machine the thread pool turns each into milliseconds
    of synchronization. Results do not depend on it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
