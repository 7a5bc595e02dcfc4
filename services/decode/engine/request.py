"""A request's life in the engine: waiting → running → finished, with its timings."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from services.common.errors import InvalidArgument


class Phase(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class GenerateSpec:
    """What a client asks for: a prompt (or a registered prefix), an output cap, speculation.

    ``spec_block`` caps the round's K_r (anchor included): 1 turns speculation off for the
    request, 0 means the engine's K_max. A value above K_max is refused (a non-speculative
    engine has K_max = 1: asking it for a block of 4 is an error, not a silent downgrade).
    ``temperature``, ``spec_mode`` and ``confidence_threshold`` are the engine's (worker-wide
    settings): None takes the engine's, a request restating them is served, one asking for
    other values is refused, also not silently downgraded.
    """

    request_id: str
    max_new_tokens: int
    prompt: list[int] | None = None
    prefix_id: str = ""
    spec_block: int = 0
    seed: int = 0
    temperature: float | None = None
    spec_mode: str | None = None
    confidence_threshold: float | None = None

    def __post_init__(self) -> None:
        if not self.request_id:
            raise InvalidArgument("request_id='': must be a non-empty string")
        if (self.prompt is None) == (not self.prefix_id):
            raise InvalidArgument(f"request {self.request_id!r}: give exactly one of "
                                  "prompt or prefix_id")
        if self.prompt is not None and not self.prompt:
            raise InvalidArgument(f"request {self.request_id!r}: prompt is empty")
        if self.max_new_tokens < 1:
            raise InvalidArgument(f"max_new_tokens={self.max_new_tokens}: must be >= 1")
        if self.spec_block < 0:
            raise InvalidArgument(f"spec_block={self.spec_block}: must be >= 0")
        if not 0 <= self.seed < 1 << 64:
            raise InvalidArgument(f"seed={self.seed}: must be in [0, 2**64)")


@dataclass(slots=True, eq=False)
class RequestRun:
    """Engine-side state of one request."""

    spec: GenerateSpec
    arrival: float
    phase: Phase = Phase.WAITING
    slot: int = -1
    tokens: list[int] = field(default_factory=list)   # prompt then committed/emitted tokens
    prompt_len: int = 0
    committed: int = 0          # n: positions with committed rows
    output: list[int] = field(default_factory=list)
    emit_times: list[float] = field(default_factory=list)
    admitted_at: float | None = None
    finished_at: float | None = None
    rounds: int = 0
    generator: torch.Generator | None = None
    ticket: object | None = None
    error: BaseException | None = None
    """Set when the request ended without decoding (activation failed); then ``on_finish``
    runs once with it."""
    on_tokens: Callable[[RequestRun, list[int], float], None] | None = None
    """Called from the engine thread with each batch of emitted tokens and their time."""
    on_finish: Callable[[RequestRun], None] | None = None

    @property
    def request_id(self) -> str:
        return self.spec.request_id

    @property
    def remaining(self) -> int:
        return self.spec.max_new_tokens - len(self.output)

    @property
    def ttft(self) -> float | None:
        return self.emit_times[0] - self.arrival if self.emit_times else None

    @property
    def tpot(self) -> float | None:
        if len(self.emit_times) < 2:
            return None
        return (self.emit_times[-1] - self.emit_times[0]) / (len(self.emit_times) - 1)

    @property
    def admission_wait(self) -> float | None:
        return None if self.admitted_at is None else self.admitted_at - self.arrival
