"""What every service command shares: the contract flags, env fallbacks, config errors.

A service declares only its own flags; :func:`service_command` adds the common ones
(``--host --port --metrics-port`` first; ``--token --tls-cert --tls-key --log-level
--log-json/--log-text --port-file`` last), loads the service's config (defaults <
``DHISPARSE_*`` < flags) and runs it; a bad value exits 2 with one line::

    @service_command("kvstore", "services.kvstore.config:KVStoreConfig",
                     "services.kvstore.server:main", default_port=50051)
    def command(capacity: str | None = opt("--capacity", "Host bytes, e.g. 64GiB.")): ...
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import typer

from services.common.config import ENV_PREFIX
from services.common.errors import ConfigError


def opt(flag: str, help_text: str, env: str | None = None) -> Any:
    """An optional flag (None = unset) with its ``DHISPARSE_*`` variable."""
    env = env or flag.lstrip("-").replace("-", "_").upper()
    return typer.Option(None, flag, help=help_text, envvar=f"{ENV_PREFIX}{env}",
                        show_default=False)


def _flag(name: str, kind: Any, info: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info,
                             annotation=kind)


def _front(default_port: int) -> list[inspect.Parameter]:
    return [
        _flag("host", str | None, opt("--host", "Bind address [127.0.0.1].")),
        _flag("port", int | None,
              opt("--port", f"gRPC port, 0 = any free port [{default_port}].")),
        _flag("metrics_port", int | None, opt("--metrics-port", "Prometheus /metrics port.")),
    ]


def _back() -> list[inspect.Parameter]:
    return [
        _flag("token", str | None, opt("--token", "Shared bearer token.")),
        _flag("tls_cert", str | None, opt("--tls-cert", "TLS certificate (PEM).")),
        _flag("tls_key", str | None, opt("--tls-key", "TLS key (PEM).")),
        _flag("log_level", str | None,
              opt("--log-level", "DEBUG, INFO, WARNING, ERROR.")),
        _flag("log_json", bool | None,
              typer.Option(None, "--log-json/--log-text", envvar=f"{ENV_PREFIX}LOG_JSON",
                           help="JSON log lines.")),
        _flag("port_file", str | None, opt("--port-file", "Write the bound gRPC port here.")),
    ]


def _load(target: str) -> Any:
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def load_config(name: str, config_cls: Any, overrides: dict[str, Any]) -> Any:
    """``config_cls.load(overrides)``, or exit 2 with ``dhisparse NAME: <error>``."""
    try:
        return config_cls.load(overrides)
    except ConfigError as exc:
        typer.echo(f"dhisparse {name}: {exc}", err=True)
        raise typer.Exit(code=2) from None


def service_command(name: str, config: str, main: str,
                    default_port: int) -> Callable[[Callable[..., Any]], Callable[..., None]]:
    """Turn a function listing a service's own flags into its full ``dhisparse`` command.

    ``config`` and ``main`` are ``module:attr`` paths, imported only when the command runs
    (``--help`` stays cheap); ``main(config)`` runs the service until SIGTERM.
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., None]:
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
               for p in inspect.signature(fn, eval_str=True).parameters.values()]
        params = [*_front(default_port), *own, *_back()]

        @functools.wraps(fn)
        def command(**flags: Any) -> None:
            cfg = load_config(name, _load(config), flags)
            _load(main)(cfg)

        command.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
        del command.__wrapped__  # typer must read the full signature, not fn's
        return command

    return decorate
