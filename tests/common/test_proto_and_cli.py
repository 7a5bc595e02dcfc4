"""Generated stubs are up to date; the CLI answers --help and refuses what is missing."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GEN = ROOT / "services" / "common" / "gen"


def test_generated_stubs_match_protos(tmp_path) -> None:
    pytest.importorskip("grpc_tools")
    out = tmp_path / "gen"
    subprocess.run([sys.executable, str(ROOT / "tools" / "gen_proto.py"), "--out", str(out)],
                   check=True, capture_output=True)
    fresh = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    committed = sorted(p.relative_to(GEN) for p in GEN.rglob("*")
                       if p.is_file() and "__pycache__" not in p.parts)
    assert fresh == committed, "run `make proto`: the set of generated files changed"
    stale = [str(p) for p in fresh if not filecmp.cmp(out / p, GEN / p, shallow=False)]
    assert not stale, f"run `make proto`: stale generated stubs {stale}"


def test_every_service_and_rpc_is_declared() -> None:
    from services.common.gen.dhisparse.v1 import decode_pb2, kvstore_pb2, residency_pb2

    expected = {
        (kvstore_pb2, "KVStore"): {"OpenHistory", "WriteRows", "ReadRows", "CommitRows",
                                    "CloseHistory", "RenewLease", "GetStats"},
        (residency_pb2, "Residency"): {"RegisterWorker", "Admit", "Release", "Session",
                                       "GetState"},
        (decode_pb2, "Decode"): {"Generate", "GetStatus"},
    }
    for (module, service), rpcs in expected.items():
        desc = module.DESCRIPTOR.services_by_name[service]
        assert desc.full_name == f"dhisparse.v1.{service}"
        assert {m.name for m in desc.methods} >= rpcs


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli.main", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_help_lists_every_subcommand() -> None:
    result = _cli("--help")
    assert result.returncode == 0, result.stderr
    for name in ("kvstore", "residency", "decode", "up", "load", "bench", "status"):
        assert name in result.stdout


def test_service_commands_accept_the_contract_flags() -> None:
    for name in ("kvstore", "residency", "decode"):
        result = _cli(name, "--help")
        if "not implemented yet" in result.stdout + result.stderr:
            pytest.fail(f"dhisparse {name} is not implemented")
        for flag in ("--host", "--port", "--metrics-port"):
            assert flag in result.stdout, (name, flag)


def test_a_missing_command_body_exits_non_zero_with_one_line() -> None:
    import typer
    from typer.testing import CliRunner

    from services.cli.main import _not_implemented, _resolve

    assert _resolve("services.no_such_module:command") is None
    app = typer.Typer()
    app.command("later")(_not_implemented("later", "services.no_such_module:command"))
    app.command("other")(lambda: None)
    result = CliRunner().invoke(app, ["later"])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == ["dhisparse later: not implemented yet "
                     "(services.no_such_module:command is missing)"]


def test_generate_request_maps_unset_settings_to_the_workers_and_set_ones_through() -> None:
    """Unset temperature / mode / threshold reach the engine as None (the worker's); set ones
    (float32 on the wire) pass through; the mode and threshold only with speculation on."""
    from services.common.gen.dhisparse.v1 import decode_pb2 as pb
    from services.decode.servicer import generate_spec

    plain = generate_spec(pb.GenerateRequest(request_id="a", prompt_tokens=[1], max_new_tokens=2))
    assert (plain.temperature, plain.spec_mode, plain.confidence_threshold) == (None, None, None)
    greedy = pb.GenerateRequest(request_id="b", prompt_tokens=[1], max_new_tokens=2,
                                sampling=pb.SamplingSettings(temperature=0.0))
    assert generate_spec(greedy).temperature == 0.0  # set to 0: restated, not "unset"
    spec = pb.SpeculationSettings(enabled=True, mode=pb.SpeculationSettings.CONFIDENCE,
                                  confidence_threshold=0.3)
    got = generate_spec(pb.GenerateRequest(request_id="c", prompt_tokens=[1], max_new_tokens=2,
                                           speculation=spec))
    assert got.spec_mode == "confidence" and abs(got.confidence_threshold - 0.3) < 1e-7
    spec.enabled = False
    off = generate_spec(pb.GenerateRequest(request_id="d", prompt_tokens=[1], max_new_tokens=2,
                                           speculation=spec))
    assert (off.spec_block, off.spec_mode, off.confidence_threshold) == (1, None, None)
