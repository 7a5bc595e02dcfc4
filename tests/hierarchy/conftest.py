"""Fixtures of the hierarchy tests: the ``device`` parameter (cpu, and cuda under ``gpu``)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # pyproject registers the markers; register them here only if that is missing.
    known = {line.split(":")[0].strip() for line in config.getini("markers")}
    for name in ("gpu", "slow"):
        if name not in known:
            config.addinivalue_line("markers", f"{name}: hierarchy test marker")


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request: pytest.FixtureRequest) -> str:
    return request.param
