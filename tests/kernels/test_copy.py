"""Copy kernels: torch reference on CPU, argument validation on CPU, bit-exact kernels on GPU."""

from __future__ import annotations

import pytest
import torch

from kernels import reference
from services.common.errors import InvalidArgument

ROW_BYTES = [4, 12, 20, 100, 656, 1152]  # 16-, 8- and 4-byte paths, odd vector counts


def rand_rows(n: int, row_bytes: int, device: str = "cpu", pin: bool = False) -> torch.Tensor:
    t = torch.randint(0, 256, (n, row_bytes), dtype=torch.uint8)
    return t.pin_memory() if pin else t.to(device)


def loop_gather(
    dst: torch.Tensor, dst_idx: torch.Tensor, src: torch.Tensor, src_idx: torch.Tensor
) -> None:
    for d, s in zip(dst_idx.tolist(), src_idx.tolist(), strict=True):
        dst[d] = src[s]


# -- CPU: the references against plain loops -------------------------------------------
@pytest.mark.parametrize("row_bytes", [4, 656])
def test_reference_gather_matches_loop(row_bytes: int) -> None:
    src, dst = rand_rows(97, row_bytes), rand_rows(53, row_bytes)
    src_idx, dst_idx = torch.randint(0, 97, (31,)), torch.randperm(53)[:31]
    want = dst.clone()
    loop_gather(want, dst_idx, src, src_idx)
    reference.gather_rows(dst, dst_idx, src, src_idx)
    assert torch.equal(dst, want)


def test_reference_pages_ring_commit() -> None:
    p, r = 4, 12
    host, pool = rand_rows(40, r), rand_rows(24, r)
    want = pool.clone()
    for dp, sp in ((1, 7), (5, 2)):
        want[dp * p : dp * p + p] = host[sp * p : sp * p + p]
    reference.copy_pages(pool, torch.tensor([1, 5]), host, torch.tensor([7, 2]), p)
    assert torch.equal(pool, want)

    ring, src = rand_rows(3 * 5, r), rand_rows(4, r)
    ring_index, pos = torch.tensor([0, 2, 2, 1]), torch.tensor([3, 7, 11, 0])
    want = ring.clone()
    for j, (i, t) in enumerate(zip(ring_index.tolist(), pos.tolist(), strict=True)):
        want[i * 5 + t % 5] = src[j]
    reference.ring_write(ring, ring_index, pos, src, 5)
    assert torch.equal(ring, want)

    dst, src = rand_rows(10, r), rand_rows(10, r)
    dst_idx, src_idx = torch.tensor([[0, 1, 2], [3, 4, 5]]), torch.tensor([[9, 8, 7], [6, 5, 4]])
    want = dst.clone()
    loop_gather(want, torch.tensor([0, 1, 3]), src, torch.tensor([9, 8, 6]))
    reference.commit_rows(dst, dst_idx, src, src_idx, torch.tensor([2, 1]))
    assert torch.equal(dst, want)


# -- CPU: validation happens before any CUDA/CuPy work ---------------------------------
def test_wrappers_reject_bad_arguments_naming_them() -> None:
    from kernels import copy

    rows, idx = rand_rows(8, 16), torch.arange(4)
    with pytest.raises(InvalidArgument, match=r"dst has dtype=torch\.float32"):
        copy.gather_rows(torch.zeros(8, 16), idx, rows, idx)
    with pytest.raises(InvalidArgument, match="dst is on device=cpu and not page-locked"):
        copy.gather_rows(rows, idx, rows, idx)
    with pytest.raises(InvalidArgument, match="strides"):
        copy.gather_rows(rand_rows(8, 32)[:, ::2], idx, rows, idx)
    with pytest.raises(InvalidArgument, match="dsts has 1 layers; expected srcs' 2"):
        copy.gather_layers([rows], idx, [rows, rows], idx)
    with pytest.raises(InvalidArgument, match="page_rows=3"):
        copy.copy_pages(rows, idx, rows, idx, 3)


def test_vector_width_and_limits() -> None:
    from kernels._loader import check_limit, vec_width

    t = torch.zeros(4, 656, dtype=torch.uint8)
    assert vec_width(656, t) == 16 and vec_width(1160, t) == 8 and vec_width(20, t) == 4
    with pytest.raises(InvalidArgument, match="row_bytes=6 must be a multiple of 4"):
        vec_width(6, t)
    with pytest.raises(InvalidArgument, match="K \\* k=70000 exceeds the kernel limit 65535"):
        check_limit("K * k", 70000, 65535)


def test_importing_kernels_needs_no_cupy() -> None:
    import sys

    import kernels.copy
    import kernels.dropin
    import kernels.resolver  # noqa: F401

    assert "cupy" not in sys.modules or torch.cuda.is_available()


# -- GPU: kernels equal their references bit for bit ------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("row_bytes", ROW_BYTES)
@pytest.mark.parametrize("n", [1, 7, 123, 4099])
def test_gather_from_pinned_host_and_device(row_bytes: int, n: int) -> None:
    from kernels import copy

    host = rand_rows(5000, row_bytes, pin=True)
    pool = rand_rows(6000, row_bytes, "cuda")
    src_idx = torch.randint(0, 5000, (n,), device="cuda").sort().values
    dst_idx = torch.randperm(6000, device="cuda")[:n]
    want = pool.clone()
    reference.gather_rows(want, dst_idx, host, src_idx)
    copy.gather_rows(pool, dst_idx, host, src_idx)
    torch.cuda.synchronize()
    assert torch.equal(pool, want)
    # device -> pinned host (backup direction)
    back = rand_rows(6000, row_bytes, pin=True)
    want_back = back.clone()
    reference.gather_rows(want_back, dst_idx.cpu(), pool.cpu(), dst_idx.cpu())
    copy.gather_rows(back, dst_idx, pool, dst_idx)
    torch.cuda.synchronize()
    assert torch.equal(back, want_back)


@pytest.mark.gpu
@pytest.mark.parametrize("row_bytes", [12, 656])
def test_layers_pages_ring_commit(row_bytes: int) -> None:
    from kernels import copy

    hosts = [rand_rows(700, row_bytes, pin=True) for _ in range(3)]
    pools = [rand_rows(900, row_bytes, "cuda") for _ in range(3)]
    want = [p.clone() for p in pools]
    src_idx, dst_idx = (
        torch.randint(0, 700, (333,), device="cuda"),
        torch.randperm(900, device="cuda")[:333],
    )
    reference.gather_layers(want, dst_idx, hosts, src_idx)
    side = torch.cuda.Stream()
    done = copy.on_side_stream(
        side, lambda d, s: copy.gather_layers(pools, d, hosts, s), dst_idx, src_idx
    )
    torch.cuda.current_stream().wait_event(done)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(pools, want, strict=True))

    p = 8
    host, pool = rand_rows(64 * p, row_bytes, pin=True), rand_rows(40 * p, row_bytes, "cuda")
    sp, dp = torch.tensor([3, 63, 0, 17], device="cuda"), torch.tensor([39, 1, 2, 0], device="cuda")
    want = pool.clone()
    reference.copy_pages(want, dp, host, sp, p)
    copy.copy_pages(pool, dp, host, sp, p)  # populate
    back, want_back = rand_rows(64 * p, row_bytes, pin=True), None
    want_back = back.clone()
    reference.copy_pages(want_back, sp.cpu(), want.cpu(), dp.cpu(), p)
    copy.copy_pages(back, sp, pool, dp, p)  # backup
    torch.cuda.synchronize()
    assert torch.equal(pool, want) and torch.equal(back, want_back)

    ring, src = rand_rows(6 * 11, row_bytes, "cuda"), rand_rows(50, row_bytes, "cuda")
    ring_index, pos = (
        torch.randint(0, 6, (50,), device="cuda"),
        torch.randperm(1000, device="cuda")[:50],
    )
    keep = torch.ones(50, dtype=torch.bool)  # one writer per ring row (a round never wraps)
    slots = (ring_index * 11 + pos % 11).cpu()
    for j in range(50):
        keep[j] = int((slots[:j] == slots[j]).sum()) == 0
    ring_index, pos, src = (
        ring_index[keep.cuda()].contiguous(),
        pos[keep.cuda()].contiguous(),
        src[keep.cuda()].contiguous(),
    )
    want = ring.clone()
    reference.ring_write(want, ring_index, pos, src, 11)
    copy.ring_write(ring, ring_index, pos, src, 11)

    dst, srcr = rand_rows(80, row_bytes, "cuda"), rand_rows(80, row_bytes, "cuda")
    d_idx, s_idx = (
        torch.randperm(80, device="cuda")[:35].view(7, 5),
        torch.randint(0, 80, (7, 5), device="cuda"),
    )
    acc = torch.randint(0, 6, (7,), device="cuda")
    want_dst = dst.clone()
    reference.commit_rows(want_dst, d_idx, srcr, s_idx, acc)
    copy.commit_rows(dst, d_idx, srcr, s_idx, acc)
    torch.cuda.synchronize()
    assert torch.equal(ring, want) and torch.equal(dst, want_dst)
