"""``ResidencyConfig``: flags and ``DHISPARSE_*`` variables of ``dhisparse residency``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from services.common.config import ServiceConfig, check_positive
from services.common.errors import ConfigError
from services.residency.core.model import PolicyConfig, PolicyKind, ReclaimOrder


@dataclass(slots=True)
class ResidencyConfig(ServiceConfig):
    """One controller per cluster. Policy fields map onto :class:`PolicyConfig`."""

    ENV_NAMES: ClassVar[dict[str, str]] = {"policy": "RESIDENCY_POLICY"}  # workers': POLICY

    port: int = 50052
    policy: str = PolicyKind.WHOLE_REQUEST.value
    reclaim_order: str = ReclaimOrder.BACKED_LARGEST.value
    populate_pages: int = 16
    populate_inflight: int = 2
    alpha_min: float = 0.1
    base_pages: int = 1
    request_slots: int = 256           # default when a worker registers with 0
    heartbeat_timeout_seconds: float = 10.0
    tick_seconds: float = 0.25         # reaper and metrics refresh period

    def __post_init__(self) -> None:
        ServiceConfig.__post_init__(self)
        for name, enum in (("policy", PolicyKind), ("reclaim_order", ReclaimOrder)):
            allowed = [e.value for e in enum]
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{self.env_var(name)}={getattr(self, name)!r}: expected one of "
                                  f"{', '.join(allowed)}")
        for name in ("heartbeat_timeout_seconds", "tick_seconds", "request_slots"):
            check_positive(name, getattr(self, name))
        self.policy_config()   # validates the policy knobs

    def policy_config(self) -> PolicyConfig:
        return PolicyConfig(policy=PolicyKind(self.policy),
                            reclaim_order=ReclaimOrder(self.reclaim_order),
                            populate_pages=self.populate_pages,
                            populate_inflight=self.populate_inflight,
                            alpha_min=self.alpha_min, base_pages=self.base_pages)
