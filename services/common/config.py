"""Typed, validated service configuration from flags and ``DHISPARSE_*`` variables.

Every service config is a slotted dataclass deriving from :class:`ServiceConfig`.
Values come, in increasing priority, from the dataclass default, the environment
(``DHISPARSE_<FIELD>``, e.g. ``DHISPARSE_CAPACITY=64GiB``) and explicit overrides
(CLI flags). Validation happens in ``__post_init__``; a bad value raises
:class:`ConfigError` naming the variable, the value and what was expected.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from services.common.errors import ConfigError

ENV_PREFIX = "DHISPARSE_"

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: str | int, name: str = "size") -> int:
    """Parse a human size (``"64GiB"``, ``"512MiB"``, ``"1.5GB"``, ``4096``) into bytes."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r}: expected a size such as 64GiB or 4096")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{name}={value}: expected a non-negative size")
        return value
    m = _SIZE_RE.match(str(value))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _SIZE_UNITS:
        raise ConfigError(
            f"{name}={value!r}: expected a size such as 64GiB, 512MiB, 1.5GB or 4096 "
            f"(units: {', '.join(sorted(u for u in _SIZE_UNITS if u))})"
        )
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


def format_size(nbytes: int) -> str:
    """Format bytes with binary units: ``format_size(3 << 30) == '3.00 GiB'``."""
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    return f"{size:.2f} TiB"


class Size(int):
    """Marker type for config fields holding a byte count parsed from a human size."""


def _convert(name: str, raw: Any, kind: Any) -> Any:
    origin = typing.get_origin(kind)
    if origin is typing.Union or str(origin) == "types.UnionType":
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if raw is None or (isinstance(raw, str) and raw == ""):
            return None
        return _convert(name, raw, args[0])
    if kind is Size:
        return parse_size(raw, name)
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name}={raw!r}: expected true/false")
    if kind is int:
        try:
            return int(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}={raw!r}: expected an integer") from None
    if kind is float:
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}={raw!r}: expected a number") from None
    if kind is str:
        return str(raw)
    return raw


C = TypeVar("C", bound="ServiceConfig")


@dataclass(slots=True)
class ServiceConfig:
    """What every service accepts: bind address, metrics port, TLS, bearer token, logs."""

    # fields whose variable is not DHISPARSE_<FIELD>: ``dhisparse up`` hands one environment
    # to every service, so a variable must mean one thing in all of them
    ENV_NAMES: typing.ClassVar[dict[str, str]] = {}

    host: str = "127.0.0.1"
    port: int = 0
    metrics_port: int | None = None
    token: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    log_level: str = "INFO"
    log_json: bool = False
    grace_seconds: float = 5.0
    port_file: str | None = None  # write the bound gRPC port here (tests, supervisors)

    def __post_init__(self) -> None:
        check_port("port", self.port)
        if self.metrics_port is not None:
            check_port("metrics_port", self.metrics_port)
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError(
                f"{env_name('tls_cert')}/{env_name('tls_key')}: give both a certificate "
                f"and a key, or neither (got cert={self.tls_cert!r}, key={self.tls_key!r})"
            )
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ConfigError(
                f"{env_name('log_level')}={self.log_level!r}: expected one of "
                "DEBUG, INFO, WARNING, ERROR, CRITICAL"
            )
        check_positive("grace_seconds", self.grace_seconds, allow_zero=True)

    @classmethod
    def env_var(cls, field: str) -> str:
        """The environment variable of ``field`` (``env_name`` unless ENV_NAMES says)."""
        return ENV_PREFIX + cls.ENV_NAMES.get(field, field.upper())

    @classmethod
    def load(
        cls: type[C],
        overrides: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> C:
        """Build from defaults < ``DHISPARSE_*`` environment < ``overrides`` (None = unset)."""
        environ = os.environ if environ is None else environ
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            var = cls.env_var(f.name)
            if overrides is not None and overrides.get(f.name) is not None:
                values[f.name] = _convert(f"--{f.name.replace('_', '-')}", overrides[f.name],
                                          hints[f.name])
            elif var in environ:
                values[f.name] = _convert(var, environ[var], hints[f.name])
        unknown = set(overrides or {}) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"unknown config fields for {cls.__name__}: {sorted(unknown)}")
        return cls(**values)


def env_name(field: str) -> str:
    """The environment variable of a config field: ``capacity`` → ``DHISPARSE_CAPACITY``."""
    return ENV_PREFIX + field.upper()


def check_port(field: str, value: int) -> None:
    if not isinstance(value, int) or not 0 <= value <= 65535:
        raise ConfigError(f"{env_name(field)}={value!r}: expected a port in 0..65535")


def check_positive(field: str, value: float, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{env_name(field)}={value!r}: expected a value {bound}")
