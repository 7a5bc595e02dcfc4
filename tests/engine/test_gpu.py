"""The engine on CUDA: fused resolver kernels on the hot path, same tokens for every policy."""

from __future__ import annotations

import pytest

from tests.engine.harness import POLICIES, outputs, pressured, serve


@pytest.mark.gpu
@pytest.mark.parametrize("topology", ["glm", "deepseek"])
def test_five_policies_identical_on_cuda_with_fused_kernels(topology) -> None:
    runs = {p: serve(pressured(p, topology, device="cuda"), n=8, max_new=16)
            for p in POLICIES}
    reference = outputs(runs["resident"])
    for policy, engine in runs.items():
        assert outputs(engine) == reference, policy
    assert runs["hisparse"].stats.counts.host > 0
    assert runs["adaptive"].stats.commands.get("retire", 0) > 0
    from kernels import dropin as fused

    assert runs["hisparse"].kv._resolve is fused.resolve
