"""``KVStoreConfig``: flags and ``DHISPARSE_*`` variables of ``dhisparse kvstore``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.common.config import ServiceConfig, Size, check_positive, env_name
from services.common.errors import ConfigError
from services.kvstore.keys import PREFIX_RE
from services.kvstore.store import StoreOptions

MAX_CHUNK_LIMIT = 4 << 20  # gRPC messages are capped at 8 MiB by services.common.server
DEFAULT_CAPACITY = Size(64 << 30)
DEFAULT_CHUNK = Size(MAX_CHUNK_LIMIT)


@dataclass(slots=True)
class KVStoreConfig(ServiceConfig):
    """One store per node. ``prefix`` names its segments: ``<shm_dir>/<prefix>-<hash>``."""

    port: int = 50051
    capacity: Size = DEFAULT_CAPACITY
    shm_dir: str = "/dev/shm"
    prefix: str = "dhisparse-kv"
    manifest_dir: str | None = None  # default: <shm_dir>/<prefix>.manifest
    default_lease_seconds: float = 60.0
    max_lease_seconds: float = 3600.0
    max_chunk_bytes: Size = DEFAULT_CHUNK
    preallocate: bool = True
    expiry_interval_seconds: float = 1.0

    def __post_init__(self) -> None:
        ServiceConfig.__post_init__(self)
        if not PREFIX_RE.match(self.prefix) or len(self.prefix) > 64:
            raise ConfigError(f"{env_name('prefix')}={self.prefix!r}: expected 1..64 "
                              "characters from [A-Za-z0-9._-], not starting or ending in '-'")
        if not Path(self.shm_dir).is_dir():
            raise ConfigError(f"{env_name('shm_dir')}={self.shm_dir!r}: not a directory")
        check_positive("capacity", self.capacity)
        if not 0 < self.max_chunk_bytes <= MAX_CHUNK_LIMIT:
            raise ConfigError(f"{env_name('max_chunk_bytes')}={self.max_chunk_bytes}: "
                              f"expected 1..{MAX_CHUNK_LIMIT} bytes")
        for name in ("default_lease_seconds", "max_lease_seconds", "expiry_interval_seconds"):
            check_positive(name, getattr(self, name))
        if self.default_lease_seconds > self.max_lease_seconds:
            raise ConfigError(f"{env_name('default_lease_seconds')}="
                              f"{self.default_lease_seconds} exceeds "
                              f"{env_name('max_lease_seconds')}={self.max_lease_seconds}")

    def store_options(self) -> StoreOptions:
        shm = Path(self.shm_dir)
        manifest = Path(self.manifest_dir) if self.manifest_dir else shm / f"{self.prefix}.manifest"
        return StoreOptions(
            capacity=self.capacity, shm_dir=shm, prefix=self.prefix, manifest_dir=manifest,
            default_lease_seconds=self.default_lease_seconds,
            max_lease_seconds=self.max_lease_seconds, max_chunk_bytes=self.max_chunk_bytes,
            preallocate=self.preallocate)
