"""``DecodeConfig``: flags and ``DHISPARSE_*`` variables of ``dhisparse decode``.

The serving fields map one-to-one onto :class:`EngineConfig`; the rest say where the
worker's residency controller and node-local kvstore are (both optional: without
``residency`` the worker admits in-process, without ``kvstore`` it backs host rows in its
own memory — a standalone worker).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from services.common.config import ServiceConfig, check_positive, env_name
from services.common.errors import ConfigError, InvalidArgument
from services.decode.engine.config import EngineConfig


@dataclass(slots=True)
class DecodeConfig(ServiceConfig):
    """One decode worker."""

    port: int = 50053
    policy: str = "adaptive"
    preset: str = "tiny"
    kv_memory: str = "2MiB"
    hot_cache: int = 16
    page_rows: int = 16
    max_requests: int = 16
    max_context: int = 1024
    reserve_pages: int = 0
    spec_block: int = 4
    spec_mode: str = "fixed"
    batch_invariant: bool = False
    device: str = "cpu"
    seed: int = 0
    temperature: float = 0.0
    worker_id: str = ""                  # default: the hostname
    advertise: str = ""                  # host:port other services reach this worker at
    residency: str | None = None         # host:port of the residency controller
    kvstore: str | None = None           # host:port of this node's kvstore
    lease_seconds: float = 30.0          # kvstore lease of this worker's histories
    admit_timeout_seconds: float = 120.0
    prefixes: str = ""                   # "name=length[:seed],..." prefilled at start
    threads: int = 1                     # torch intra-op threads (1: tiny ops on few cores)

    def __post_init__(self) -> None:
        ServiceConfig.__post_init__(self)
        if not self.worker_id:
            self.worker_id = socket.gethostname()
        for name in ("lease_seconds", "admit_timeout_seconds", "threads"):
            check_positive(name, getattr(self, name))
        for name in ("residency", "kvstore"):
            value = getattr(self, name)
            if value is not None and not _is_address(value):
                raise ConfigError(f"{env_name(name)}={value!r}: expected HOST:PORT")
        self.prefix_specs()
        try:
            self.engine_config()
        except InvalidArgument as exc:
            raise ConfigError(str(exc)) from None

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            policy=self.policy, preset=self.preset, kv_memory=self.kv_memory,
            hot_cache=self.hot_cache, page_rows=self.page_rows,
            max_requests=self.max_requests, max_context=self.max_context,
            reserve_pages=self.reserve_pages, spec_block=self.spec_block,
            spec_mode=self.spec_mode, batch_invariant=self.batch_invariant,
            device=self.device, seed=self.seed, temperature=self.temperature)

    def prefix_specs(self) -> list[tuple[str, int, int]]:
        """``prefixes`` parsed as (name, length, seed) triples."""
        out = []
        for item in filter(None, (p.strip() for p in self.prefixes.split(","))):
            name, _, rest = item.partition("=")
            length, _, seed = rest.partition(":")
            if not name or not length.isdigit() or int(length) < 1 or (
                    seed and not seed.isdigit()):
                raise ConfigError(f"{env_name('prefixes')}: {item!r} is not name=length[:seed] "
                                  "(e.g. system=256:1)")
            out.append((name, int(length), int(seed or 0)))
        return out


def _is_address(value: str) -> bool:
    host, _, port = value.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536
