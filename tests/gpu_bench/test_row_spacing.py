"""The row-spacing merge (``bench.resolver.spacing``): the gather's best plain grid beside the
resolver's 20%-miss cases per request length, the table and the picture. CPU only."""

from __future__ import annotations

import json

import pytest

from bench.resolver.spacing import main, merge, spacing_kib


def gather_row(regions: int, grid: int, us: float, gbps: float, **kw) -> dict:
    return dict(variant="copy.cu", mode="shm", order="", whole_pool=False, regions=regions,
                rows=410, grid=grid, us=us, gbps=gbps, of_memcpy=gbps / 55.0) | kw


def resolver_case(batch: int, us: float, gbps: float) -> dict:
    return dict(item_bytes=656, top_k=2048, batch=batch, profile="miss20",
                unique_miss_rows=410 * batch, us=dict(median=us, p10=us - 1, p90=us + 1),
                GBps=gbps, frac_of_h2d_memcpy=gbps / 55.0)


def write(folder, s: int, gather_rows: list[dict], cases: list[dict]) -> None:
    (folder / f"gather_{s}.json").write_text(json.dumps(
        {"setup": {"row_bytes": 656, "seq_len": s}, "rows": gather_rows}))
    (folder / f"res_{s}.json").write_text(json.dumps(
        {"setup": {"items": "656", "seq_len": s}, "cases": cases,
         "ceiling": {"h2d_pinned_1GiB_GBps": 55.0}}))


def test_each_length_pairs_the_gathers_best_plain_grid_with_the_resolver(tmp_path) -> None:
    write(tmp_path, 100000, [
        gather_row(32, 16, 250.0, 34.4), gather_row(32, 66, 266.0, 32.3),
        gather_row(32, 16, 100.0, 80.0, variant="bulk"),  # a probe's way: not the plain gather
        gather_row(32, 16, 90.0, 90.0, order="across"),  # another order
        {"mode": "vmm", "error": "RuntimeError: no"},
        gather_row(160, 66, 1436.0, 30.0)], [resolver_case(32, 253.1, 34.0),
                                              resolver_case(160, 1360.3, 31.6)])
    write(tmp_path, 20000, [gather_row(160, 16, 924.0, 46.6)], [resolver_case(160, 960.9, 44.8)])
    rec = merge(tmp_path)
    assert [e["seq_len"] for e in rec["lengths"]] == [100000, 20000]
    first = rec["lengths"][0]
    assert [(p["batch"], p["grid"], p["us"]) for p in first["gather"]] == [
        (32, 16, 250.0), (160, 66, 1436.0)]
    assert first["resolver"][1]["spacing_kib"] == round(spacing_kib(100000, 410, 656), 1) == 156.2
    lines = rec["table_md"].splitlines()
    assert lines[2] == "| 100000 | 156 | 32 | 34.4 (63%) | 253.1 (34.0, 62%) | 0.99 |"
    assert lines[4] == "| 20000 | 31 | 160 | 46.6 (85%) | 960.9 (44.8, 81%) | 0.96 |"


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
