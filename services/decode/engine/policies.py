"""The five serving policies of DESIGN.md §6: one engine, five settings.

| policy        | host backing | hot cache | optional residency | speculation |
|---------------|--------------|-----------|--------------------|-------------|
| resident      | no           | no        | all history (required) | no      |
| hisparse      | yes          | B rows    | no                 | no          |
| adaptive      | yes          | B rows    | yes (reclaimable)  | no          |
| resident-spec | no           | no        | all history (required) | yes     |
| adaptive-spec | yes          | B rows    | yes (reclaimable)  | yes         |

The model kernels are the same under every policy, so greedy token streams must be
identical across them (I3).
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    resident: bool        # whole history is required device memory, no host backing
    optional: bool        # imported history may stay on device as reclaimable pages
    speculative: bool     # draft-model speculative rounds

    @property
    def uses_host(self) -> bool:
        return not self.resident


POLICIES: dict[str, Policy] = {
    "resident": Policy("resident", resident=True, optional=False, speculative=False),
    "hisparse": Policy("hisparse", resident=False, optional=False, speculative=False),
    "adaptive": Policy("adaptive", resident=False, optional=True, speculative=False),
    "resident-spec": Policy("resident-spec", resident=True, optional=False, speculative=True),
    "adaptive-spec": Policy("adaptive-spec", resident=False, optional=True, speculative=True),
}


def get_policy(name: str) -> Policy:
    """The policy called ``name``; unknown names raise ``InvalidArgument`` listing the choices."""
    try:
        return POLICIES[name]
    except KeyError:
        raise InvalidArgument(
            f"--policy={name!r}: expected one of {', '.join(POLICIES)}") from None
