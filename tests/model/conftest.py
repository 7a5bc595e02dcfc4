"""One intra-op thread for these tests (restored after each test).

The reference model runs many tiny ops; on a loaded 2-core machine, torch's intra-op
thread pool turns each into milliseconds of synchronization. Results do not depend on it.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
