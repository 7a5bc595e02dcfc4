"""``dhisparse bench serve`` and ``dhisparse bench load-step`` (routed by services/cli/main.py).

Flag names are a contract (tests and dashboards rely on them); every flag maps to a field
of ``BenchSettings`` / ``LoadStepSettings``. Bad input prints one line naming the flag,
the value and the constraint, and exits with code 2 before anything runs.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from services.common.errors import InvalidArgument
from services.decode.bench import report
from services.decode.bench.settings import BenchSettings, LoadStepSettings

S, L = BenchSettings(), LoadStepSettings()


def _fail(command: str, message: str) -> typer.Exit:
    typer.echo(f"dhisparse bench {command}: {message}", err=True)
    return typer.Exit(code=2)


def _check_out(flag: str, path: str | None) -> None:
    if path is not None and not Path(path).resolve().parent.is_dir():
        raise InvalidArgument(f"{flag}={path!r}: directory {Path(path).parent} does not exist")


def _setup(threads: int) -> None:
    import torch

    if isinstance(threads, bool) or threads < 1:
        raise InvalidArgument(f"--threads={threads}: must be an integer >= 1")
    torch.set_num_threads(threads)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=True)


def _console() -> Console:
    """stdout; a wide page when it is not a terminal (so piped tables are not cut)."""
    console = Console()
    return console if console.is_terminal else Console(width=200)


def _opt(default, flag: str, help_text: str):
    if isinstance(default, bool):
        return typer.Option(default, flag, help=help_text)
    return typer.Option(default, flag, help=help_text, metavar=_METAVARS.get(flag, "INT"))


_METAVARS = {"--output-range-ratio": "FLOAT", "--phase-seconds": "FLOAT", "--policy": "LIST",
             "--concurrency": "LIST", "--kv-memory": "SIZE", "--json": "FILE",
             "--plot": "FILE.png", "--dump-tokens": "FILE", "--topology": "glm|deepseek",
             "--device": "cpu|cuda", "--preset": "NAME", "--clock": "wall|cpu"}
_FLOATS = ("output_range_ratio", "phase_seconds")
_TEXT = ("policy", "concurrency", "kv_memory", "topology", "device", "preset", "clock")


def _coerce(fields: dict[str, object]) -> dict[str, object]:
    """Numbers arrive as text so that a malformed one gets the same one-line error."""
    out = dict(fields)
    for name, value in fields.items():
        if name in _TEXT or not isinstance(value, str):
            continue
        flag = "--" + name.replace("_", "-")
        try:
            out[name] = float(value) if name in _FLOATS else int(value)
        except ValueError:
            kind = "a number" if name in _FLOATS else "an integer"
            raise InvalidArgument(f"{flag}={value!r}: expected {kind}") from None
    return out


_OUTPUTS = {"json_path": "--json", "plot": "--plot", "dump_tokens": "--dump-tokens"}


def _settings(command: str, cls: type, flags: dict[str, object]):
    """Threads, output paths and settings from a command's flags; one-line error, exit 2."""
    try:
        _setup(_coerce({"threads": flags.pop("threads")})["threads"])  # type: ignore[arg-type]
        for name, flag in _OUTPUTS.items():
            _check_out(flag, flags.pop(name))  # type: ignore[arg-type]
        return cls(**_coerce(flags)).validate()
    except InvalidArgument as exc:
        raise _fail(command, str(exc)) from None


def serve_command(
    policy: str = _opt(S.policy, "--policy", "One policy or a comma list."),
    concurrency: str = _opt(S.concurrency, "--concurrency",
                            "Offered concurrency C: one value or a comma list (the sweep)."),
    input_len: str = _opt(str(S.input_len), "--input-len", "Prefix tokens per request."),
    output_len: str = _opt(str(S.output_len), "--output-len", "Output cap per request."),
    output_range_ratio: str = _opt(str(S.output_range_ratio), "--output-range-ratio",
                                     "Caps drawn from [ratio·len, len]; 1 = fixed cap."),
    requests: str = _opt(str(S.requests), "--requests", "Requests finished per (policy, C)."),
    hot_cache: str = _opt(str(S.hot_cache), "--hot-cache", "Hot-cache rows B per request."),
    top_k: str | None = _opt(None, "--top-k", "Selected rows k (default: the preset's)."),
    kv_memory: str = _opt(S.kv_memory, "--kv-memory", "KV budget M (human size)."),
    topology: str = _opt(S.topology, "--topology", "glm or deepseek."),
    spec_block: str = _opt(str(S.spec_block), "--spec-block", "K_max of speculative rounds."),
    seed: str = _opt(str(S.seed), "--seed", "Model weights and prefixes seed."),
    batch_invariant: bool = _opt(False, "--batch-invariant",
                                 "Batch-invariant kernels (bit-identical streams)."),
    device: str = _opt(S.device, "--device", "cpu or cuda."),
    preset: str = _opt(S.preset, "--preset", "Model preset (tiny, demo, h200-deepseek)."),
    page_rows: str = _opt(str(S.page_rows), "--page-rows", "Rows per KV page."),
    max_context: str = _opt(str(S.max_context), "--max-context", "Context limit per request."),
    prefixes: str = _opt(str(S.prefixes), "--prefixes", "Prepared prefixes (request i: i mod n)."),
    populate_pages: str = _opt(str(S.populate_pages), "--populate-pages", "Pages per populate."),
    clock: str = _opt(S.clock, "--clock", "wall (elapsed) or cpu (process CPU time)."),
    threads: str = _opt("1", "--threads", "torch CPU threads."),
    json_path: str | None = _opt(None, "--json", "Write rows + header as JSON."),
    plot: str | None = _opt(None, "--plot", "Write a Figure-4-style PNG."),
    dump_tokens: str | None = _opt(None, "--dump-tokens", "Write every request's token ids."),
) -> None:
    """Closed-loop serving benchmark: C requests in flight, per policy and C.

    ``--device cuda --preset h200`` runs the one-H200 configuration instead
    (services/decode/gpu_bench: 656-byte FP8 rows, k = 2048, 32K-token prefixes)."""
    if preset == "h200":
        from services.decode.gpu_bench.cli import serve_h200

        out = str(Path(json_path).parent) if json_path else "."
        return serve_h200(out=out, budget_s=480.0, fused=device == "cuda",
                          output_len=int(output_len), concurrency=concurrency,
                          hot_cache_sweep=True)
    settings = _settings("serve", BenchSettings, dict(locals()))
    from services.decode.bench.serve import run_serve

    head = report.header("serve", settings)
    total = len(settings.policies) * len(settings.concurrencies) * settings.requests
    with _progress() as bar:
        task = bar.add_task("serve", total=total)
        result = run_serve(
            settings, on_finish=lambda _run: bar.advance(task),
            on_point=lambda p, c: bar.update(task, description=f"{p} C{c}"))
    title = (f"bench serve: {settings.preset} {settings.topology}, input {settings.input_len}, "
             f"output {settings.output_len}, B={settings.hot_cache}, M={settings.kv_memory}")
    _console().print(report.table(title, result.rows, report.SERVE_COLUMNS))
    if json_path:
        report.write_json(json_path, head, rows=result.rows)
    if dump_tokens:
        report.write_json(dump_tokens, head, tokens=result.tokens, commands=result.commands)
    if plot:
        report.plot_serve(plot, result.rows, title)


def load_step_command(
    policy: str = _opt(L.policy, "--policy", "Arms: policies (default adaptive,hisparse)."),
    concurrency: str = _opt(L.concurrency, "--concurrency",
                            "Phase schedule: C per phase, e.g. 4,16,4."),
    phase_seconds: str = _opt(str(L.phase_seconds), "--phase-seconds", "Seconds per phase."),
    phase_requests: str | None = _opt(None, "--phase-requests",
                                      "Requests submitted per phase (instead of seconds)."),
    input_len: str = _opt(str(L.input_len), "--input-len", "Prefix tokens per request."),
    output_len: str = _opt(str(L.output_len), "--output-len", "Output cap per request."),
    output_range_ratio: str = _opt(str(L.output_range_ratio), "--output-range-ratio",
                                     "Caps drawn from [ratio·len, len]; 1 = fixed cap."),
    hot_cache: str = _opt(str(L.hot_cache), "--hot-cache", "Hot-cache rows B per request."),
    top_k: str | None = _opt(None, "--top-k", "Selected rows k (default: the preset's)."),
    kv_memory: str = _opt(L.kv_memory, "--kv-memory", "KV budget M (human size)."),
    topology: str = _opt(L.topology, "--topology", "glm or deepseek."),
    spec_block: str = _opt(str(L.spec_block), "--spec-block", "K_max of speculative rounds."),
    seed: str = _opt(str(L.seed), "--seed", "Model weights and prefixes seed."),
    batch_invariant: bool = _opt(False, "--batch-invariant", "Batch-invariant kernels."),
    device: str = _opt(L.device, "--device", "cpu or cuda."),
    preset: str = _opt(L.preset, "--preset", "Model preset."),
    page_rows: str = _opt(str(L.page_rows), "--page-rows", "Rows per KV page."),
    max_context: str = _opt(str(L.max_context), "--max-context", "Context limit per request."),
    prefixes: str = _opt(str(L.prefixes), "--prefixes", "Prepared prefixes."),
    populate_pages: str = _opt(str(L.populate_pages), "--populate-pages", "Pages per populate."),
    clock: str = _opt(S.clock, "--clock", "wall (elapsed) or cpu (process CPU time)."),
    threads: str = _opt("1", "--threads", "torch CPU threads."),
    json_path: str | None = _opt(None, "--json", "Write per-phase rows + timelines as JSON."),
    plot: str | None = _opt(None, "--plot", "Write a Figure-6-style PNG."),
    dump_tokens: str | None = _opt(None, "--dump-tokens", "Write every request's token ids."),
) -> None:
    """Load step C_low -> C_high -> C_low, optional residency on (adaptive) vs off.

    ``--device cuda --preset h200`` runs the one-H200 configuration instead."""
    if preset == "h200":
        from services.decode.gpu_bench.cli import load_step_h200

        out = str(Path(json_path).parent) if json_path else "."
        return load_step_h200(out=out, budget_s=300.0, fused=device == "cuda",
                              output_len=int(output_len))
    settings = _settings("load-step", LoadStepSettings, dict(locals()))
    from services.decode.bench.loadstep import run_load_step

    head = report.header("load-step", settings)
    with _progress() as bar:
        task = bar.add_task("load-step", total=None)
        result = run_load_step(settings, on_finish=lambda _run: bar.advance(task),
                               on_arm=lambda p: bar.update(task, description=p))
    sched = "→".join(f"C{c}" for c in settings.concurrencies)
    title = (f"bench load-step {sched}: {settings.preset} {settings.topology}, input "
             f"{settings.input_len}, output {settings.output_len}, B={settings.hot_cache}, "
             f"M={settings.kv_memory}")
    _console().print(report.table(title, result.rows, report.LOAD_STEP_COLUMNS))
    if json_path:
        report.write_json(json_path, head, rows=result.rows, timelines=result.timelines,
                          phase_starts=result.phase_starts)
    if dump_tokens:
        report.write_json(dump_tokens, head, tokens=result.tokens)
    if plot:
        report.plot_load_step(plot, result.timelines, result.phase_starts,
                              settings.concurrencies, title)
