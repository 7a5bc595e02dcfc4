"""What the engine measured: tokens, rounds, resolver counters, sessions, coverage."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.decode.hierarchy import SelectionCounts


@dataclass(slots=True)
class EngineStats:
    output_tokens: int = 0
    rounds: int = 0
    round_tokens: int = 0        # tokens emitted by decode rounds (spec: A + 1 per round)
    round_queries: int = 0
    accepted_tokens: int = 0     # draft tokens accepted
    step_seconds: float = 0.0
    steps: int = 0
    active_sum: int = 0
    coverage_sum: float = 0.0
    samples: int = 0
    backup_bytes_total: int = 0
    commands: dict[str, int] = field(default_factory=dict)
    # host wall seconds outside decode rounds, by phase (admission, activate, finish,
    # command:<kind>): where a serve point's time between steps goes (perf_counter, not
    # the engine clock; device work still queued when a phase returns is not in it)
    host_phase_seconds: dict[str, float] = field(default_factory=dict)
    counts: SelectionCounts = field(default_factory=SelectionCounts)
    finished_requests: int = 0

    def tokens(self, n: int) -> None:
        self.output_tokens += n

    def round(self, emitted: int, queries: int) -> None:
        self.rounds += 1
        self.round_tokens += emitted
        self.round_queries += queries
        self.accepted_tokens += emitted - 1

    def step_time(self, seconds: float) -> None:
        self.steps += 1
        self.step_seconds += seconds

    def resolver(self, cumulative: SelectionCounts) -> None:
        self.counts = SelectionCounts(**{f: getattr(cumulative, f)
                                         for f in cumulative.__slots__})

    def sample(self, active: int, coverage: float) -> None:
        self.samples += 1
        self.active_sum += active
        self.coverage_sum += coverage

    def command(self, kind: str, pages: int) -> None:
        self.commands[kind] = self.commands.get(kind, 0) + pages

    def phase(self, name: str, seconds: float) -> None:
        self.host_phase_seconds[name] = self.host_phase_seconds.get(name, 0.0) + seconds

    def backup_bytes(self, n: int) -> None:
        self.backup_bytes_total += n

    def finish(self) -> None:
        self.finished_requests += 1

    @property
    def tokens_per_round(self) -> float:
        return self.round_tokens / self.rounds if self.rounds else 0.0

    @property
    def active_mean(self) -> float:
        return self.active_sum / self.samples if self.samples else 0.0

    @property
    def coverage_mean(self) -> float:
        return self.coverage_sum / self.samples if self.samples else 0.0
