"""``service_command``: common contract flags around a service's own, env fallbacks,
one-line config errors with exit code 2."""

from __future__ import annotations

from dataclasses import dataclass

import typer
from typer.testing import CliRunner

from services.common.cli import opt, service_command
from services.common.config import ServiceConfig

SEEN: list[ServiceConfig] = []


@dataclass(slots=True)
class DemoConfig(ServiceConfig):
    capacity: int = 7


def demo_main(config: DemoConfig) -> None:
    SEEN.append(config)


@service_command("demo", f"{__name__}:DemoConfig", f"{__name__}:demo_main", default_port=9)
def command(capacity: int | None = opt("--capacity", "How much.")) -> None:
    """Run the demo service."""


def _app() -> typer.Typer:
    app = typer.Typer(rich_markup_mode=None)
    app.command("demo")(command)
    app.command("other")(lambda: None)
    return app


def test_help_lists_contract_and_own_flags_in_order() -> None:
    out = CliRunner().invoke(_app(), ["demo", "--help"]).output
    flags = ["--host", "--port", "--metrics-port", "--capacity", "--token", "--tls-cert",
             "--tls-key", "--log-level", "--log-json", "--port-file"]
    positions = [out.index(f) for f in flags]
    assert positions == sorted(positions)
    assert "any free port [9]" in out and "DHISPARSE_CAPACITY" in out


def test_flags_then_env_then_defaults() -> None:
    SEEN.clear()
    result = CliRunner().invoke(_app(), ["demo", "--port", "5", "--log-json"],
                                env={"DHISPARSE_CAPACITY": "3", "DHISPARSE_PORT": "6"})
    assert result.exit_code == 0, result.output
    cfg = SEEN[-1]
    assert (cfg.port, cfg.capacity, cfg.log_json, cfg.host) == (5, 3, True, "127.0.0.1")


def test_bad_config_exits_2_with_one_line() -> None:
    SEEN.clear()
    result = CliRunner().invoke(_app(), ["demo", "--tls-cert", "c.pem"])
    assert result.exit_code == 2 and not SEEN
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("dhisparse demo: DHISPARSE_TLS_CERT"), lines


def test_a_service_variable_means_one_thing_across_the_services() -> None:
    """``dhisparse up`` hands its environment to every service: beyond the contract flags
    every service takes, a ``DHISPARSE_*`` variable belongs to one service (residency's
    policy once read DHISPARSE_POLICY, the workers' policy variable, and crashed on it)."""
    import dataclasses
    import inspect

    from services.decode.cli import command as decode
    from services.decode.config import DecodeConfig
    from services.kvstore.cli import command as kvstore
    from services.kvstore.config import KVStoreConfig
    from services.residency.cli import command as residency
    from services.residency.config import ResidencyConfig

    owners: dict[str, set[str]] = {}
    common: set[str] | None = None
    for name, cmd, config in (("kvstore", kvstore, KVStoreConfig),
                              ("residency", residency, ResidencyConfig),
                              ("decode", decode, DecodeConfig)):
        envs = {getattr(p.default, "envvar", None)
                for p in inspect.signature(cmd).parameters.values()} - {None}
        # the config's own reading of the environment (flags left unset) as well
        envs |= {config.env_var(f.name) for f in dataclasses.fields(config)}
        common = envs if common is None else common & envs
        for env in envs:
            owners.setdefault(env, set()).add(name)
    assert common and "DHISPARSE_PORT" in common
    shared = {env: by for env, by in owners.items() if len(by) > 1 and env not in common}
    assert not shared, shared


def test_status_finds_the_controller_of_the_cluster_up_started(tmp_path) -> None:
    """``dhisparse up`` picks free ports and writes them to cluster.json: ``status`` reads
    the residency's from there unless given ``--address``; with neither, the default."""
    import json

    from services.residency.cli import DEFAULT_ADDRESS, status_address

    assert status_address(None, tmp_path) == DEFAULT_ADDRESS
    (tmp_path / "cluster.json").write_text(json.dumps({
        "kvstore": {"grpc": "127.0.0.1:41001"}, "residency": {"grpc": "127.0.0.1:41002"}}))
    assert status_address(None, tmp_path) == "127.0.0.1:41002"
    assert status_address("10.0.0.1:50052", tmp_path) == "10.0.0.1:50052"
    (tmp_path / "cluster.json").write_text("{not json")
    assert status_address(None, tmp_path) == DEFAULT_ADDRESS
