"""The row-spacing merge (``bench.resolver.spacing``): the gather's best plain grid beside the
resolver's 20%-miss cases per request length, the table and the picture. CPU only."""

from __future__ import annotations

import json

import pytest

from bench.resolver.spacing import main, merge, spacing_kib


def gather_row(regions: int, grid: int, us: float, gbps: float, **kw) -> dict:
    return dict(variant="copy.cu", mode="shm", order="", whole_pool=False, regions=regions,
                rows=410, grid=grid, us=us, gbps=gbps, of_memcpy=gbps / 55.0) | kw


def resolver_case(batch: int, us: float, gbps: float | None, **kw) -> dict:
    case = dict(item_bytes=656, top_k=2048, batch=batch, profile="miss20",
                unique_miss_rows=410 * batch, us=dict(median=us, p10=us - 1, p90=us + 1),
                check={"ok": True})
    if gbps is not None:  # cases without misses have no GB/s
        case |= dict(GBps=gbps, frac_of_h2d_memcpy=gbps / 55.0)
    return case | kw


def write(folder, s: int, gather_rows: list[dict] | None, cases: list[dict] | None) -> None:
    if gather_rows is not None:
        (folder / f"gather_{s}.json").write_text(json.dumps(
            {"setup": {"row_bytes": 656, "seq_len": s}, "rows": gather_rows}))
    if cases is not None:
        (folder / f"res_{s}.json").write_text(json.dumps(
            {"setup": {"items": "656", "seq_len": s}, "cases": cases,
             "ceiling": {"h2d_pinned_1GiB_GBps": 55.0}}))


def test_each_length_pairs_the_gathers_best_plain_grid_with_the_resolver(tmp_path) -> None:
    write(tmp_path, 100000, [
        gather_row(32, 16, 250.0, 34.4), gather_row(32, 66, 266.0, 32.3),
        gather_row(32, 16, 100.0, 80.0, variant="bulk"),  # a probe's way: not the plain gather
        gather_row(32, 16, 90.0, 90.0, order="across"),  # another order
        gather_row(32, 16, 80.0, 99.0, last_row_equal=False),  # a wrong copy is not a result
        gather_row(32, 16, 70.0, 99.0, whole_pool=True),  # another shape
        gather_row(32, 66, 200.0, 43.0, mode="register"),  # another allocation
        {"mode": "vmm", "error": "RuntimeError: no"},
        gather_row(160, 66, 1436.0, 30.0)], [
        resolver_case(32, 253.1, 34.0), resolver_case(160, 1360.3, 31.6),
        resolver_case(32, 12.0, None, profile="hit100", unique_miss_rows=0),
        resolver_case(32, 900.0, 47.0, profile="cold", unique_miss_rows=2048 * 32),
        resolver_case(32, 60.0, 40.0, top_k=512, unique_miss_rows=102 * 32),
        resolver_case(32, 300.0, 47.0, item_bytes=1152),
        resolver_case(160, 100.0, 90.0, check={"ok": False})])
    write(tmp_path, 20000, [gather_row(160, 16, 924.0, 46.6)], [resolver_case(160, 960.9, 44.8)])
    write(tmp_path, 10000, [gather_row(32, 16, 192.0, 44.8)], None)  # the resolver timed out
    write(tmp_path, 5000, None, [resolver_case(32, 207.0, 41.6)])  # the gather failed
    rec = merge(tmp_path)
    assert [e["seq_len"] for e in rec["lengths"]] == [100000, 20000, 10000, 5000]
    first = rec["lengths"][0]
    assert first["gather_mode"] == "shm"
    assert [(p["batch"], p["grid"], p["us"]) for p in first["gather"]] == [
        (32, 16, 250.0), (160, 66, 1436.0)]
    assert [(p["batch"], p["us"]) for p in first["resolver"]] == [(32, 253.1), (160, 1360.3)]
    assert first["resolver"][1]["spacing_kib"] == round(spacing_kib(100000, 410, 656), 1) == 156.2
    lines = rec["table_md"].splitlines()
    assert lines[2] == "| 100000 | 156 | 32 | 34.4 (63%) | 253.1 (34.0, 62%) | 0.99 |"
    assert lines[4] == "| 20000 | 31 | 160 | 46.6 (85%) | 960.9 (44.8, 81%) | 0.96 |"
    assert lines[5:] == ["| 10000 | 16 | 32 | 44.8 (81%) | - | - |",
                         "| 5000 | 8 | 32 | - | 207.0 (41.6, 76%) | - |"]


def test_the_command_writes_the_json_and_the_picture_and_refuses_an_empty_folder(
        tmp_path, monkeypatch, capsys) -> None:
    write(tmp_path, 50000, [gather_row(32, 16, 230.0, 37.0)], [resolver_case(32, 240.0, 36.0)])
    out = tmp_path / "out" / "row_spacing.json"
    monkeypatch.setattr("sys.argv", ["spacing", str(tmp_path), str(out)])
    main()
    assert json.loads(out.read_text())["lengths"][0]["seq_len"] == 50000
    assert out.with_suffix(".png").stat().st_size > 1000
    assert "| 50000 | 78 | 32 |" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match=r"no gather_<S>\.json or res_<S>\.json"):
        merge(tmp_path / "out")


def test_a_resolver_file_of_several_row_sizes_needs_the_gathers_size(tmp_path) -> None:
    write(tmp_path, 20000, None, [resolver_case(32, 210.0, 40.9),
                                  resolver_case(32, 320.0, 47.0, item_bytes=1152)])
    with pytest.raises(ValueError, match=r"res_20000\.json: item sizes \[656, 1152\]"):
        merge(tmp_path)
    write(tmp_path, 20000, [gather_row(32, 16, 192.0, 44.8)], None)
    assert [p["us"] for p in merge(tmp_path)["lengths"][0]["resolver"]] == [210.0]
