"""Config: human sizes, DHISPARSE_* variables, flags over env, clear errors."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from services.common.config import ServiceConfig, Size, format_size, parse_size
from services.common.errors import ConfigError


@dataclass(slots=True)
class StoreLikeConfig(ServiceConfig):
    capacity: Size = 1 << 30  # type: ignore[assignment]
    lease_seconds: float = 30.0


@pytest.mark.parametrize("text,expected", [
    ("64GiB", 64 << 30), ("512MiB", 512 << 20), ("1.5GB", 1_500_000_000), ("4096", 4096),
    ("8 KiB", 8192), ("2tib", 2 << 40), (123, 123),
])
def test_parse_size(text, expected) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["64 parsecs", "-1GiB", "GiB", "", "1e3", True, -5])
def test_parse_size_rejects(text) -> None:
    with pytest.raises(ConfigError, match="expected"):
        parse_size(text, "DHISPARSE_CAPACITY")


def test_format_size() -> None:
    assert format_size(3 << 30) == "3.00 GiB"
    assert format_size(512) == "512 B"


def test_env_then_flags() -> None:
    env = {"DHISPARSE_CAPACITY": "2GiB", "DHISPARSE_PORT": "7001", "DHISPARSE_LOG_JSON": "yes"}
    cfg = StoreLikeConfig.load(environ=env)
    assert (cfg.capacity, cfg.port, cfg.log_json) == (2 << 30, 7001, True)
    cfg = StoreLikeConfig.load({"port": 7002, "capacity": "1MiB", "host": None}, environ=env)
    assert (cfg.capacity, cfg.port, cfg.host) == (1 << 20, 7002, "127.0.0.1")


@pytest.mark.parametrize("env,fragments", [
    ({"DHISPARSE_PORT": "70000"}, ["DHISPARSE_PORT", "70000", "0..65535"]),
    ({"DHISPARSE_PORT": "http"}, ["DHISPARSE_PORT", "'http'", "integer"]),
    ({"DHISPARSE_CAPACITY": "lots"}, ["DHISPARSE_CAPACITY", "'lots'", "64GiB"]),
    ({"DHISPARSE_LOG_JSON": "maybe"}, ["DHISPARSE_LOG_JSON", "'maybe'", "true/false"]),
    ({"DHISPARSE_LOG_LEVEL": "LOUD"}, ["DHISPARSE_LOG_LEVEL", "'LOUD'", "DEBUG"]),
    ({"DHISPARSE_TLS_CERT": "/c.pem"}, ["DHISPARSE_TLS_CERT", "DHISPARSE_TLS_KEY", "both"]),
    ({"DHISPARSE_METRICS_PORT": "-3"}, ["DHISPARSE_METRICS_PORT", "-3", "0..65535"]),
])
def test_bad_values_name_variable_value_and_expectation(env, fragments) -> None:
    with pytest.raises(ConfigError) as info:
        StoreLikeConfig.load(environ=env)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_flag_errors_name_the_flag() -> None:
    with pytest.raises(ConfigError, match="--capacity='huge'"):
        StoreLikeConfig.load({"capacity": "huge"}, environ={})
    with pytest.raises(ConfigError, match="unknown config fields"):
        StoreLikeConfig.load({"capacityy": "1GiB"}, environ={})
