"""CUDA: mapped histories are registered (cudaHostRegister, mapped) and kernels read
host rows through the device view without a copy. Run by the lead on a GPU machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.kvstore.client import KVStoreClient
from tests.kvstore.harness import StoreProcess, assert_no_segments

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(("row_bytes", "num_rows"), [(656, 431), (4096, 6), (1, 123)])
def test_device_view_reads_host_rows_zero_copy(prefix: str, tmp_path: Path, row_bytes: int,
                                               num_rows: int) -> None:
    store = StoreProcess(prefix, tmp_path).start()
    try:
        with KVStoreClient(store.target, "gpu-0") as client:  # register_cuda: auto
            h = client.open("gpu", 0, row_bytes, num_rows)
            host = torch.randint(0, 256, (num_rows, row_bytes), dtype=torch.uint8)
            h.write(0, host)
            h.commit(0, num_rows)
            dev = h.device_rows()
            assert dev.is_cuda and dev.shape == (num_rows, row_bytes)
            assert dev.data_ptr() != 0
            idx = torch.randperm(num_rows, device="cuda")[: max(1, num_rows // 3)]
            gathered = dev.index_select(0, idx)  # a kernel reading host memory directly
            assert torch.equal(gathered.cpu(), host[idx.cpu()])
            # Host-side change after registration is visible to the device (no stale copy).
            h2 = client.open("gpu", 1, row_bytes, num_rows)
            h2.write(0, host.flip(0))
            assert torch.equal(h2.device_rows().cpu(), host.flip(0))
            client.close("gpu", 0)  # unregisters and unmaps
            client.close("gpu", 1)
        assert_no_segments(prefix)
    finally:
        assert store.stop() == 0
