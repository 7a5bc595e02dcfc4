"""The CLI contract: outputs (JSON fields, PNG, token dump, table) and bad input
(exit code 2, one line naming the flag), through ``python -m services.cli.main``."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from tests.bench_serve.conftest import cli

PNG = b"\x89PNG\r\n\x1a\n"
SERVE_FIELDS = {"policy", "concurrency", "output_tokens_per_s", "ttft_mean_s", "ttft_p99_s",
                "tpot_mean_s", "active_mean", "host_fetch_share", "coverage_mean",
                "admission_wait_mean_s", "spec_tokens_per_round", "reclaimed_pages",
                "populated_pages"}
LOAD_STEP_FIELDS = {"policy", "phase", "concurrency", "allocated_mean", "coverage_mean",
                    "host_fetch_share", "reclaimed_pages", "populated_pages"}
TINY = ["--preset", "tiny", "--input-len", "32", "--output-len", "8", "--hot-cache", "4",
        "--page-rows", "8", "--kv-memory", "64KiB", "--batch-invariant"]


def finish(proc, timeout: float = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def test_serve_writes_json_plot_tokens_and_table(tmp_path: Path) -> None:
    paths = {k: tmp_path / f"serve.{k}" for k in ("json", "png", "tokens")}
    rc, out, err = finish(cli(
        "serve", *TINY, "--policy", "hisparse,adaptive-spec", "--concurrency", "1,3",
        "--requests", "4", "--json", str(paths["json"]), "--plot", str(paths["png"]),
        "--dump-tokens", str(paths["tokens"])))
    assert rc == 0, err
    doc = json.loads(paths["json"].read_text())
    assert {"git_sha", "date", "machine", "config"} <= doc["header"].keys()
    assert doc["header"]["config"]["input_len"] == 32
    assert [(r["policy"], r["concurrency"]) for r in doc["rows"]] == [
        ("hisparse", 1), ("hisparse", 3), ("adaptive-spec", 1), ("adaptive-spec", 3)]
    for r in doc["rows"]:
        assert SERVE_FIELDS <= r.keys()
        assert r["output_tokens_per_s"] > 0 and r["output_tokens"] == 4 * 8
        assert r["slots"] == r["concurrency"] and r["kv_pages"] == 32  # 64 KiB / 2 KiB
    assert paths["png"].read_bytes()[:8] == PNG
    tokens = json.loads(paths["tokens"].read_text())["tokens"]
    assert tokens["hisparse"]["3"] == tokens["adaptive-spec"]["3"]
    assert all(len(t) == 8 for t in tokens["hisparse"]["1"].values())
    assert "adaptive-spec" in out and "tok/s" in out


def test_load_step_writes_phases_timelines_and_plot(tmp_path: Path) -> None:
    js, png = tmp_path / "ls.json", tmp_path / "ls.png"
    rc, out, err = finish(cli(
        "load-step", *TINY, "--concurrency", "1,4,1", "--phase-requests", "4",
        "--kv-memory", "24KiB", "--json", str(js), "--plot", str(png)))
    assert rc == 0, err
    doc = json.loads(js.read_text())
    assert [(r["policy"], r["phase"], r["concurrency"]) for r in doc["rows"]] == [
        (p, i, c) for p in ("adaptive", "hisparse") for i, c in enumerate((1, 4, 1))]
    for r in doc["rows"]:
        assert LOAD_STEP_FIELDS <= r.keys()
    on = {r["phase"]: r for r in doc["rows"] if r["policy"] == "adaptive"}
    off = {r["phase"]: r for r in doc["rows"] if r["policy"] == "hisparse"}
    assert on[0]["host_fetch_share"] < off[0]["host_fetch_share"] / 5
    assert on[1]["reclaimed_pages"] > 0 and off[1]["reclaimed_pages"] == 0
    for tl in doc["timelines"].values():
        assert len(tl["t"]) == len(tl["allocated"]) == len(tl["host_fetch_share"]) > 5
        assert max(tl["allocated"]) > 1
    assert png.read_bytes()[:8] == PNG
    assert "hisparse" in out


BAD = {
    "unknown-policy": (["serve", "--policy", "fastest"], "--policy", "fastest"),
    "unknown-policy-in-list": (["load-step", "--policy", "adaptive,nope"], "--policy", "nope"),
    "unknown-topology": (["serve", "--topology", "mesh"], "--topology", "mesh"),
    "unknown-preset": (["serve", "--preset", "huge"], "--preset", "huge"),
    "zero-input": (["serve", "--input-len", "0"], "--input-len", "0"),
    "negative-output": (["serve", "--output-len", "-3"], "--output-len", "-3"),
    "malformed-int": (["serve", "--requests", "many"], "--requests", "many"),
    "bad-concurrency": (["serve", "--concurrency", "4,-2"], "--concurrency", "4,-2"),
    "zero-top-k": (["serve", "--top-k", "0"], "--top-k", "0"),
    "zero-spec-block": (["serve", "--spec-block", "0"], "--spec-block", "0"),
    "zero-hot-cache": (["serve", "--hot-cache", "0"], "--hot-cache", "0"),
    "bad-size": (["serve", "--kv-memory", "lots"], "--kv-memory", "lots"),
    "budget-below-resident-request": (["serve", "--kv-memory", "64KiB"], "--kv-memory",
                                      "64KiB"),
    "budget-below-hot-cache": (["serve", "--policy", "hisparse", "--kv-memory", "16KiB"],
                               "--kv-memory", "16KiB"),
    "context": (["serve", "--input-len", "4000", "--output-len", "200"], "--max-context",
                "4096"),
    "requests-below-c": (["serve", "--requests", "4", "--concurrency", "8"], "--requests",
                         "4"),
    "unknown-device": (["serve", "--device", "tpu"], "--device", "tpu"),
    "missing-dir": (["serve", "--json", "/nonexistent-dir/x.json"], "--json", "nonexistent"),
    "unknown-clock": (["serve", "--clock", "sundial"], "--clock", "sundial"),
    "phase-seconds": (["load-step", "--phase-seconds", "0"], "--phase-seconds", "0"),
    "range-ratio": (["load-step", "--output-range-ratio", "1.5"], "--output-range-ratio",
                    "1.5"),
}


# The list, also run as real processes (each pays a ~2-3 s torch import, so the
# whole table runs in process through the same typer app).
SUBPROCESS = ["unknown-policy", "unknown-topology", "zero-input", "budget-below-resident-request",
              "context"]


def check_one_line(name: str, rc: int, out: str, err: str) -> None:
    _, flag, value = BAD[name]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, (rc, err)
    assert len(lines) == 1, err
    assert flag in lines[0] and value in lines[0], lines[0]
    assert lines[0].startswith("dhisparse bench ")
    assert out == ""  # nothing ran


@functools.cache
def subprocess_results() -> dict[str, tuple[int, str, str]]:
    """Start the bad invocations at once, then collect."""
    procs = {name: cli(*BAD[name][0]) for name in SUBPROCESS}
    return {name: finish(p) for name, p in procs.items()}


@pytest.mark.parametrize("name", SUBPROCESS)
def test_bad_input_process_exits_2_with_one_line(name: str) -> None:
    check_one_line(name, *subprocess_results()[name])


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_exits_2_with_one_line(name: str) -> None:
    from typer.testing import CliRunner

    from services.cli.main import app

    result = CliRunner().invoke(app, ["bench", *BAD[name][0]])
    check_one_line(name, result.exit_code, result.stdout, result.stderr)


def test_results_name_the_commit_given_by_the_environment_over_a_stale_checkout(
        monkeypatch) -> None:
    """The device machine's tree can carry an old .git: DHISPARSE_GIT_SHA wins when set."""
    from services.decode.bench.report import git_sha

    monkeypatch.setenv("DHISPARSE_GIT_SHA", "feedbee")
    assert git_sha() == "feedbee"
    monkeypatch.delenv("DHISPARSE_GIT_SHA")
    assert git_sha() != "feedbee"
