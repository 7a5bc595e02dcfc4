"""The resolver wrappers' settings (``kernels.resolver_settings``) and the dependent-launch
plumbing of ``kernels._loader``: CPU only, no CUDA needed."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidArgument


def test_copy_blocks_setting_must_be_ascii_digits(monkeypatch) -> None:
    from kernels import resolver as kres

    monkeypatch.setenv("DHISPARSE_COPY_BLOCKS", "\u00b2")  # '²' passes str.isdigit()
    with pytest.raises(InvalidArgument, match="DHISPARSE_COPY_BLOCKS="):
        kres.default_copy_blocks()


def test_copy_blocks_setting_is_validated(monkeypatch) -> None:
    from kernels import resolver as kres

    monkeypatch.setenv("DHISPARSE_COPY_BLOCKS", "66")
    assert kres.default_copy_blocks() == 66
    monkeypatch.setenv("DHISPARSE_COPY_BLOCKS", "auto")
    assert kres.default_copy_blocks() == 0  # the kernel's rule
    for bad in ("0", "-3", "many", str(kres.MAX_COPY_BLOCKS + 1)):
        monkeypatch.setenv("DHISPARSE_COPY_BLOCKS", bad)
        with pytest.raises(InvalidArgument, match=f"DHISPARSE_COPY_BLOCKS='{bad}' must be"):
            kres.default_copy_blocks()


def test_copy_early_setting_is_validated(monkeypatch) -> None:
    from kernels import resolver as kres

    monkeypatch.delenv("DHISPARSE_COPY_EARLY", raising=False)
    assert kres.default_copy_early() is True
    monkeypatch.setenv("DHISPARSE_COPY_EARLY", "0")
    assert kres.default_copy_early() is False
    for bad in ("2", "yes", ""):
        monkeypatch.setenv("DHISPARSE_COPY_EARLY", bad)
        with pytest.raises(InvalidArgument, match=f"DHISPARSE_COPY_EARLY='{bad}' must be 0 or 1"):
            kres.default_copy_early()


def test_copy_tma_rule_and_setting(monkeypatch) -> None:
    from kernels import resolver as kres
    from kernels.resolver_settings import TMA_MIN_ROWS

    hopper, ampere = (9, 0), (8, 0)
    monkeypatch.delenv("DHISPARSE_COPY_TMA", raising=False)  # auto unless asked otherwise
    assert kres.copy_tma(None, 1152, 16, hopper) == TMA_MIN_ROWS
    assert kres.copy_tma(None, 656, 16, hopper) == -1
    monkeypatch.setenv("DHISPARSE_COPY_TMA", "auto")
    # auto: whole 128-byte lines of 16-byte vectors within the shared budget, on sm_90+,
    # from TMA_MIN_ROWS rows on
    assert kres.copy_tma(None, 1152, 16, hopper) == TMA_MIN_ROWS == 8192
    assert kres.copy_tma(None, 1536, 16, hopper) == 8192
    for rb, w, cap in ((656, 16, hopper), (1152, 16, ampere), (1664, 16, hopper),
                       (1152, 8, hopper)):
        assert kres.copy_tma(None, rb, w, cap) == -1, (rb, w, cap)
    # forced on: any row of 16-byte vectors that fits, from 0 rows; off: never
    assert kres.copy_tma(True, 656, 16, hopper) == 0
    assert kres.copy_tma(False, 1152, 16, hopper) == -1
    monkeypatch.setenv("DHISPARSE_COPY_TMA", "1")
    assert kres.copy_tma(None, 16, 16, hopper) == 0
    monkeypatch.setenv("DHISPARSE_COPY_TMA", "0")
    assert kres.copy_tma(None, 1152, 16, hopper) == -1
    # asked for where it cannot run, or a bad value: refused, naming what was asked
    monkeypatch.setenv("DHISPARSE_COPY_TMA", "1")
    with pytest.raises(InvalidArgument, match=r"DHISPARSE_COPY_TMA=1 needs .*got width 4"):
        kres.copy_tma(None, 12, 4, hopper)
    with pytest.raises(InvalidArgument, match=r"tma=1 needs .*got 8\.0"):
        kres.copy_tma(True, 1152, 16, ampere)
    with pytest.raises(InvalidArgument, match=r"row_bytes <= 1536 \(got 4096\)"):
        kres.copy_tma(True, 4096, 16, hopper)
    for bad in ("2", "on", ""):
        monkeypatch.setenv("DHISPARSE_COPY_TMA", bad)
        with pytest.raises(InvalidArgument, match=f"DHISPARSE_COPY_TMA='{bad}' must be one of"):
            kres.copy_tma(None, 1152, 16, hopper)


def test_commit_parts_setting_is_validated_and_the_rule_fills_the_sms(monkeypatch) -> None:
    from kernels import resolver as kres

    monkeypatch.setenv("DHISPARSE_COMMIT_PARTS", "3")
    assert kres.default_commit_parts() == 3
    monkeypatch.setenv("DHISPARSE_COMMIT_PARTS", "auto")
    assert kres.default_commit_parts() == 0  # commit_parts_rule
    for bad in ("0", "-1", "two", str(kres.MAX_COMMIT_PARTS + 1)):
        monkeypatch.setenv("DHISPARSE_COMMIT_PARTS", bad)
        with pytest.raises(InvalidArgument, match=f"DHISPARSE_COMMIT_PARTS='{bad}' must be"):
            kres.default_commit_parts()
    # batch 1..33 on 132 SMs: 4 parts; then fewer, 1 once the batch fills the SMs
    assert [kres.commit_parts_rule(b, 132) for b in (1, 32, 33, 44, 45, 66, 67, 132, 256)] == [
        4, 4, 4, 3, 2, 2, 1, 1, 1]
    # copy blocks launched: the rest of one wave of 2 per SM while that is at least 99 (3/4
    # of the SMs), else one per SM
    assert [kres.launched_copy_blocks(c, 132) for c in (1, 4, 128, 132, 133, 160, 165, 166,
                                                        256, 1024)] == [
        263, 260, 136, 132, 131, 104, 99, 132, 132, 132]
    # a GPU of one SM: never none
    assert [kres.launched_copy_blocks(c, 1) for c in (1, 2, 4)] == [1, 1, 1]


def test_dependent_launch_structures_match_cuda_h() -> None:
    """ctypes mirrors of CUlaunchAttribute / CUlaunchConfig (offsets from cuda.h of CUDA 13:
    gcc offsetof) and the void** parameter block handed to cuLaunchKernelEx."""
    import ctypes

    import numpy as np

    from kernels import _loader as ld

    assert ctypes.sizeof(ld._LaunchAttribute) == 72 and ld._LaunchAttribute.value.offset == 8
    cfg = ld._LaunchConfig
    assert ctypes.sizeof(cfg) == 56
    assert [cfg.sharedMemBytes.offset, cfg.hStream.offset, cfg.attrs.offset,
            cfg.numAttrs.offset] == [24, 32, 40, 48]
    args = (np.uint64(2**63 + 5), np.int32(-3), np.uint32(7), np.int64(-9))
    block, _keep = ld.kernel_params(args)
    types = (ctypes.c_uint64, ctypes.c_int32, ctypes.c_uint32, ctypes.c_int64)
    got = [ctypes.cast(block[i], ctypes.POINTER(t)).contents.value for i, t in enumerate(types)]
    assert got == [2**63 + 5, -3, 7, -9]


def test_pdl_setting_is_validated(monkeypatch) -> None:
    from kernels import _loader as ld

    monkeypatch.setenv("DHISPARSE_PDL", "0")
    assert not ld.pdl_enabled()
    monkeypatch.setenv("DHISPARSE_PDL", "yes")
    with pytest.raises(InvalidArgument, match="DHISPARSE_PDL='yes' must be 0 or 1"):
        ld.pdl_enabled()


def test_compile_variants_follow_the_environment(monkeypatch) -> None:
    from kernels import resolver as kres

    for var in ("DHISPARSE_RESOLVER_TRACE", "DHISPARSE_RESOLVER_LINEINFO",
                "DHISPARSE_RESOLVER_TMA_PRELOAD"):
        monkeypatch.delenv(var, raising=False)
    assert kres.defines() == ()
    monkeypatch.setenv("DHISPARSE_RESOLVER_LINEINFO", "1")
    assert kres.defines() == ("-lineinfo",)
    monkeypatch.setenv("DHISPARSE_RESOLVER_TRACE", "1")
    assert kres.defines() == ("-DRESOLVER_TRACE", "-lineinfo")
    monkeypatch.setenv("DHISPARSE_RESOLVER_TMA_PRELOAD", "1")
    assert kres.defines() == ("-DRESOLVER_TRACE", "-lineinfo", "-DRESOLVER_TMA_PRELOAD")
    monkeypatch.setenv("DHISPARSE_RESOLVER_TMA_PRELOAD", "0")
    assert kres.defines() == ("-DRESOLVER_TRACE", "-lineinfo")
    monkeypatch.setenv("DHISPARSE_RESOLVER_LINEINFO", "yes")
    with pytest.raises(InvalidArgument, match="DHISPARSE_RESOLVER_LINEINFO='yes' must be 0 or 1"):
        kres.defines()



def test_lookup_shape_is_one_block_per_sm_up_to_the_sm_count(monkeypatch) -> None:
    from kernels import resolver as kres

    for var in ("DHISPARSE_LOOKUP_BLOCKS", "DHISPARSE_RESOLVER_TRACE",
                "DHISPARSE_RESOLVER_LINEINFO"):
        monkeypatch.delenv(var, raising=False)
    assert kres.lookup_shape() == (1024, 1)
    assert kres.lookup_variant() == ("resolve_lookup", (), 1024)
    # auto: two 512-thread blocks per SM for a batch above the SM count (one wave)
    assert kres.lookup_shape(132, 132) == (1024, 1)
    assert kres.lookup_shape(133, 132) == (512, 2)
    assert kres.lookup_variant(160, 132) == ("resolve_lookup_2", ("-DNT=512",), 512)
    for value, shape in (("1", (1024, 1)), ("2", (1024, 2)), ("2x512", (512, 2))):
        monkeypatch.setenv("DHISPARSE_LOOKUP_BLOCKS", value)
        assert kres.lookup_shape() == shape == kres.lookup_shape(160, 132)  # as asked
    assert kres.lookup_variant() == ("resolve_lookup_2", ("-DNT=512",), 512)
    monkeypatch.setenv("DHISPARSE_LOOKUP_BLOCKS", "3")
    with pytest.raises(InvalidArgument, match="DHISPARSE_LOOKUP_BLOCKS='3' must be one of"):
        kres.lookup_shape()


def test_hit_form_defaults_to_rank_above_the_sm_count_where_it_can_run(monkeypatch) -> None:
    from kernels import resolver as kres

    monkeypatch.delenv("DHISPARSE_LOOKUP_HITS", raising=False)
    assert kres.hit_form(None, 4096, True, 160, 132) == "rank"
    assert kres.hit_form(None, 4096, True, 132, 132) == "index"  # one wave: index loads
    assert kres.hit_form(None, 4096, False, 160, 132) == "index"  # its shared memory
    assert kres.hit_form(None, 70_000, True, 160, 132) == "index"  # past a u16 prefix
    assert kres.hit_form(None, 0, True, 160, 132) == "index"  # no hot cache
    assert kres.hit_form("index", 4096, True, 160, 132) == "index"
    assert kres.hit_form("rank", 4096, True, 1, 132) == "rank"
    monkeypatch.setenv("DHISPARSE_LOOKUP_HITS", "rank")
    assert kres.hit_form(None, 4096, True, 1, 132) == "rank"
    assert kres.hit_form("index", 4096, True, 1, 132) == "index"  # the argument first
    with pytest.raises(InvalidArgument, match=r"hits='rank' needs hot_slots <= 65535 \(got 7"):
        kres.hit_form("rank", 70_000, True, 1, 132)
    with pytest.raises(InvalidArgument, match=r"hits='rank': its shared memory .* does not fit"):
        kres.hit_form("rank", 4096, False, 1, 132)
    assert kres.hit_form("rank", 0, True, 1, 132) == "index"  # no hot cache, no hits to find
    monkeypatch.setenv("DHISPARSE_LOOKUP_HITS", "scan")
    with pytest.raises(InvalidArgument, match="DHISPARSE_LOOKUP_HITS='scan' must be one of"):
        kres.hit_form(None, 4096, True, 1, 132)


def test_identical_queries_kernels_only_for_several_queries_with_entries() -> None:
    """The _q lookups (resolver_lookup.cu same_queries) for K > 1 and k > 0 only: their pass
    over the other queries begins at entry k, so k = 0 would loop while bounds differ."""
    from kernels import resolver as kres

    assert kres.query_kernels(8, 2048) == kres.query_kernels(2, 1) == "_q"
    assert kres.query_kernels(1, 2048) == kres.query_kernels(8, 0) == ""
