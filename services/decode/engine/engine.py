"""The decode engine: continuous batching over the KV hierarchy, five policies.

One ``Engine`` is one decode worker. ``submit`` queues a request; ``step`` runs one
scheduling iteration::

    admit      FIFO through the residency core (tickets; Backup/Retire/Populate commands
               executed on the hierarchy and acknowledged); granted requests import their
               prefix (rows into the hierarchy, index keys into the index state) and emit
               their first token from the prefix's logits
    decode     one round for every running request: K = 1, or a speculative round of
               K_r ≤ K_max queries (drafter proposes, target verifies in one forward,
               acceptance commits n' = n + 1 + A, rejected rows are dropped)
    retire     finished requests release their slot, pages and host histories

Repopulation is paced: one batch of Populate commands per step (a batch is what the
controller's bound lets it issue at once); Populates issued by acks later in the same
step wait for the next one. Acks in process are instant, so without the pacing a single
finished request would let the controller refill every free page before the next
admission reclaims them again (seen on the H200: 12,704 pages populated and 2,736
retired in 42 speculative steps at C32).

Time is wall-clock (``clock``); tokens are emitted with their timestamps.
"""

from __future__ import annotations

import struct
import time
from collections import OrderedDict, deque
from collections.abc import Callable

import torch

from services.common.backing import HostBackingProvider
from services.common.errors import DHiSparseError, InvalidArgument, NotFound
from services.common.logging import get_logger
from services.decode.engine.admission import LocalAdmission
from services.decode.engine.commands import execute_command
from services.decode.engine.config import EngineConfig
from services.decode.engine.kv_adapter import HierarchyKV
from services.decode.engine.request import GenerateSpec, Phase, RequestRun
from services.decode.engine.stats import EngineStats
from services.decode.hierarchy import Hierarchy, InProcessBackingProvider, backup, commit_rows
from services.decode.hierarchy.pages import device_ints
from services.decode.model.model import DSAModel, Prefix
from services.decode.spec.acceptance import greedy_accept, sample_from, speculative_accept
from services.decode.spec.drafter import Drafter, DrafterConfig
from services.decode.spec.memory import SpecMemory, spec_memory
from services.residency.core import Command, CommandKind, PolicyConfig

log = get_logger("decode.engine")

PREFIX_CACHE = 8  # prompt prefills kept for reuse (identical prompts import, not prefill)


class Engine:
    def __init__(self, config: EngineConfig, provider: HostBackingProvider | None = None,
                 admission: LocalAdmission | None = None, worker_id: str = "local",
                 clock: Callable[[], float] = time.perf_counter,
                 model: DSAModel | None = None) -> None:
        """``model``: a prebuilt model of ``config.model`` (e.g. the GPU bench's
        ``FastDSAModel`` sharing weights across engines); default: a fresh ``DSAModel``."""
        self.config = config
        self.policy = config.policy_
        self.clock = clock
        self.model = model if model is not None else DSAModel(config.model)
        self.index = self.model.new_index_state()
        hcfg = config.hierarchy_config()
        if provider is None and self.policy.uses_host:
            provider = InProcessBackingProvider(pin=config.device.startswith("cuda"))
        self.hierarchy = Hierarchy(hcfg, config.source_specs(), provider)
        self.kv = HierarchyKV(self.hierarchy, config.model.groups)
        self.admission = admission or LocalAdmission(
            worker_id, hcfg.num_pages, hcfg.reserve_pages, config.max_requests,
            PolicyConfig(populate_pages=config.populate_pages))
        self.drafter = Drafter(self.model, DrafterConfig(
            layers=config.draft_layers, window=config.draft_window, page=config.page_rows,
            k_max=config.k_max, mode=config.spec_mode, greedy=config.temperature == 0),
            config.max_requests) if self.policy.speculative else None
        self.stats = EngineStats()
        self.prefixes: dict[str, Prefix] = {}
        self._prompt_cache: OrderedDict[tuple[int, ...], Prefix] = OrderedDict()
        self.waiting: deque[RequestRun] = deque()
        self.running: dict[str, RequestRun] = {}
        self.finished: list[RequestRun] = []
        self.failed: list[RequestRun] = []  # granted, but activation failed (run.error)
        self._free_slots = list(range(config.max_requests - 1, -1, -1))
        self._deferred: list[Command] = []  # Populates paced to a later step
        self._populated = False             # this step's Populate batch already ran
        # every slot's tokens (prompt, then output) on the device: the drafter reads its
        # histories as views instead of a fresh copy of the whole context each round
        self._token_buf = torch.zeros(config.max_requests, config.max_context,
                                      dtype=torch.int64, device=config.device)

    # -- requests ---------------------------------------------------------------------------
    def register_prefix(self, prefix_id: str, tokens: list[int]) -> Prefix:
        """Prefill ``tokens`` once; requests naming ``prefix_id`` import its KV."""
        prefix = self.model.prefill(torch.tensor(tokens, dtype=torch.int64,
                                                 device=self.config.device))
        self.prefixes[prefix_id] = prefix
        return prefix

    def _block_cap(self, spec: GenerateSpec) -> int:
        """K_r's cap for ``spec``: its block (0 = the engine's K_max), at most K_max."""
        return min(self.config.k_max, spec.spec_block or self.config.k_max)

    def _check_worker_settings(self, spec: GenerateSpec) -> None:
        """A request may restate the engine's sampling and speculation settings, not change
        them (they hold for the whole batch)."""
        cfg = self.config
        if spec.temperature is not None and not _same_f32(spec.temperature, cfg.temperature):
            raise InvalidArgument(
                f"temperature={spec.temperature}: this worker samples at temperature="
                f"{cfg.temperature} (a worker-wide setting: --temperature)")
        # a K_r of 1 never drafts; the first token comes from prefill, so K_r stays below
        # max_new_tokens: a request of <= 2 tokens never speculates, like a block of 1
        speculative = (self.drafter is not None
                       and min(self._block_cap(spec), spec.max_new_tokens - 1) > 1)
        if spec.spec_mode is not None and speculative and spec.spec_mode != cfg.spec_mode:
            raise InvalidArgument(
                f"speculation mode={spec.spec_mode!r}: this worker speculates in mode "
                f"{cfg.spec_mode!r} (a worker-wide setting: --spec-mode)")
        if spec.confidence_threshold is not None and speculative:
            own = self.drafter.cfg.threshold
            if cfg.spec_mode != "confidence" or not _same_f32(spec.confidence_threshold, own):
                have = (f"confidence_threshold={own}" if cfg.spec_mode == "confidence"
                        else f"mode {cfg.spec_mode!r}, no confidence threshold")
                raise InvalidArgument(
                    f"confidence_threshold={spec.confidence_threshold}: this worker "
                    f"speculates with {have} (a worker-wide setting)")

    def submit(self, spec: GenerateSpec,
               on_tokens: Callable[[RequestRun, list[int], float], None] | None = None,
               on_finish: Callable[[RequestRun], None] | None = None) -> RequestRun:
        """Queue a request (validated now; nothing changes on a bad one). The callbacks
        run on the engine's thread: ``on_tokens(run, tokens, time)`` per emission and
        ``on_finish(run)`` once."""
        cfg = self.config
        if spec.request_id in self.running or any(
                r.request_id == spec.request_id for r in self.waiting):
            raise InvalidArgument(f"request_id={spec.request_id!r} is already in flight")
        if spec.prefix_id and spec.prefix_id not in self.prefixes:
            raise NotFound(f"prefix_id={spec.prefix_id!r} is not registered "
                           f"(known: {sorted(self.prefixes)})")
        if spec.spec_block > cfg.k_max:
            raise InvalidArgument(f"spec_block={spec.spec_block} exceeds K_max={cfg.k_max}")
        self._check_worker_settings(spec)
        prompt_len = (len(spec.prompt) if spec.prompt is not None
                      else self.prefixes[spec.prefix_id].length)
        if prompt_len + spec.max_new_tokens + cfg.k_max > cfg.max_context:
            raise InvalidArgument(
                f"prompt ({prompt_len}) + max_new_tokens ({spec.max_new_tokens}) + K_max "
                f"({cfg.k_max}) exceeds max_context={cfg.max_context}")
        for i, t in enumerate(spec.prompt or ()):
            if not 0 <= t < cfg.model.vocab:
                raise InvalidArgument(f"prompt[{i}]={t}: prompt tokens must lie in "
                                      f"0..{cfg.model.vocab - 1}")
        max_rows = prompt_len + spec.max_new_tokens + cfg.k_max
        need, room = cfg.required_pages_for(max_rows), cfg.num_pages - cfg.reserve_pages
        if need > room:
            raise InvalidArgument(
                f"request {spec.request_id!r} needs {need} pages (policy {cfg.policy}, "
                f"{max_rows} rows) but the KV budget admits at most {room} pages")
        run = RequestRun(spec, arrival=self.clock(), prompt_len=prompt_len,
                         on_tokens=on_tokens, on_finish=on_finish)
        self.waiting.append(run)
        return run

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    # -- the loop ---------------------------------------------------------------------------
    def step(self) -> list[RequestRun]:
        """One iteration: admit, one decode round, retire. Returns requests that emitted."""
        self._populated = False
        self._admit()
        # a request with nothing left to emit (max_new_tokens = 1: its token came at
        # activation; or capped by a cancel) finishes without a round
        batch = [r for r in self.running.values() if r.remaining > 0]
        if batch:
            self._round(batch)
        for run in list(self.running.values()):
            if run.remaining <= 0:
                self._finish(run)
        self._run_commands()
        if self.running:  # coverage of running requests; idle steps say nothing
            self.stats.sample(len(self.running), self.coverage())
        return batch

    @property
    def deferred_populates(self) -> list[Command]:
        """Populate commands received and not yet executed (paced to the next step): the
        controller counts their pages as allocated already."""
        return list(self._deferred)

    def run_until_idle(self, max_steps: int = 1_000_000) -> None:
        for _ in range(max_steps):
            if self.idle:
                return
            self.step()
        raise RuntimeError(f"engine not idle after max_steps={max_steps}")

    def spec_memory(self) -> SpecMemory | None:
        """Ring and staging bytes per session and per worker (eq. 9, §3.4), from the
        formulas; ``allocated_spec_bytes`` reports what is actually allocated."""
        if self.drafter is None:
            return None
        cfg, m = self.config, self.config.model
        ring = self.drafter.rings[0]
        return spec_memory(
            window=cfg.draft_window, page=cfg.page_rows, k_max=cfg.k_max,
            draft_row_bytes=len(self.drafter.rings) * ring.storage[0].numel()
            * ring.storage.element_size(),
            live_sources=m.payloads_per_group, slots=cfg.max_requests, top_k=m.top_k,
            row_bytes=m.row_bytes)

    def allocated_spec_bytes(self) -> tuple[int, int]:
        """(draft ring bytes, staging arena bytes) as allocated on this worker."""
        ring = self.drafter.nbytes if self.drafter is not None else 0
        group = next(iter(self.hierarchy.groups.values()))
        arenas = 1 if self.hierarchy.shared_staging else len(self.hierarchy.groups)
        staging = (arenas * group.staging.capacity * group.spec.row_bytes
                   * group.spec.payload_layers)
        return ring, staging

    def coverage(self) -> float:
        """Mean over groups of ``hierarchy.coverage`` (same value), with one device→host
        read in all instead of one per request and group."""
        groups = list(self.hierarchy.groups.values())
        parts = [[s.page_ready[: s.eligible_pages] for s in g.requests.values()]
                 for g in groups]
        sums = [torch.cat(p).sum() for p in parts if p]
        ready = iter(torch.stack(sums).tolist() if sums else [])
        total = 0.0
        for g, p in zip(groups, parts, strict=True):
            eligible = sum(s.eligible_pages for s in g.requests.values())
            r = next(ready) if p else 0
            total += r / eligible if eligible else 1.0
        return total / len(groups)

    # -- admission --------------------------------------------------------------------------
    def _prefix_of(self, run: RequestRun) -> Prefix:
        if run.spec.prefix_id:
            return self.prefixes[run.spec.prefix_id]
        key = tuple(run.spec.prompt or ())
        prefix = self._prompt_cache.get(key)
        if prefix is None:
            prefix = self.model.prefill(torch.tensor(key, dtype=torch.int64,
                                                     device=self.config.device))
            self._prompt_cache[key] = prefix
            while len(self._prompt_cache) > PREFIX_CACHE:
                self._prompt_cache.popitem(last=False)
        self._prompt_cache.move_to_end(key)
        return prefix

    def _max_rows(self, run: RequestRun) -> int:
        return run.prompt_len + run.spec.max_new_tokens + self.config.k_max

    def _admit(self) -> None:
        cfg, p = self.config, self.config.page_rows
        t0 = time.perf_counter()
        for run in self.waiting:
            if run.ticket is None:
                history = run.prompt_len // p if self.policy.optional else 0
                run.ticket = self.admission.admit(
                    run.request_id, cfg.required_pages_for(self._max_rows(run)), history)
        self.stats.phase("admission", time.perf_counter() - t0)
        self._run_commands()

    def _activate(self, run: RequestRun) -> None:
        t0 = time.perf_counter()
        prefix = self._prefix_of(run)
        grant = run.ticket.grant
        history = {name: [prefix.rows[(g, q)] for q in range(self.config.model.payloads_per_group)]
                   for g, name in enumerate(self.kv.names)}
        try:
            self.hierarchy.admit(run.request_id, self._max_rows(run), history=history,
                                 max_optional=grant.optional_pages)
        except DHiSparseError as exc:
            # the request cannot start here (e.g. the kvstore has no room for its host
            # history): the hierarchy rolled the admission back; give the grant back and
            # fail this request alone, the others keep decoding
            self._fail(run, exc)
            return
        run.slot = self._free_slots.pop()
        self.kv.request_of[run.slot] = run.request_id
        self.index.open(run.slot)
        self.model.import_prefix(prefix, run.slot, self.index)
        if self.drafter is not None:
            self.drafter.reset(run.slot)
        run.phase, run.admitted_at = Phase.RUNNING, self.clock()
        run.tokens = [int(t) for t in prefix.tokens.tolist()]
        self._token_buf[run.slot, : run.prompt_len] = prefix.tokens.to(self.config.device)
        run.committed = run.prompt_len
        if self.config.temperature > 0:
            run.generator = torch.Generator().manual_seed(  # any uint64 seed: wrap, no overflow
                (self.config.seed * 1_000_003 + run.spec.seed) % (1 << 64))
        self._emit(run, [self._first_token(run, prefix.next_logits)])
        self.running[run.request_id] = run
        self.stats.phase("activate", time.perf_counter() - t0)

    def _first_token(self, run: RequestRun, logits: torch.Tensor) -> int:
        if self.config.temperature == 0:
            return int(logits.argmax())
        probs = torch.softmax(logits.float() / self.config.temperature, dim=-1)
        return int(sample_from(probs.view(1, -1).cpu(), torch.rand(1, generator=run.generator)))

    def _activate_granted(self) -> None:
        """Activate granted requests (the ledger holds them already), in FIFO order."""
        for run in [r for r in self.waiting
                    if r.ticket is not None and self.admission.granted(r.ticket)]:
            self.waiting.remove(run)
            self._activate(run)

    def _run_commands(self) -> None:
        """Activate granted requests, then execute the controller's commands; acks can
        grant more, so repeat until quiet.

        With a remote controller a command can race its request: it may arrive before the
        grant reached this worker, or after the request finished here but before the
        controller saw the release. Such a command is acknowledged as not done (``ok=False``:
        the controller un-reserves a Populate, abandons a reclaim step and retries later)
        instead of touching a request the hierarchy does not hold."""
        while True:
            self._activate_granted()
            commands, self._deferred = self._deferred + self.admission.take_commands(), []
            # a replaced controller's (remote admission after a restart): its successor's
            # ledger never had them, so they are neither run nor acknowledged
            commands = [c for c in commands if self.admission.current(c)]
            if self._populated:
                self._deferred = [c for c in commands if c.kind is CommandKind.POPULATE]
                commands = [c for c in commands if c.kind is not CommandKind.POPULATE]
            if not commands:
                return
            self._populated |= any(c.kind is CommandKind.POPULATE for c in commands)
            for cmd in commands:
                if cmd.request_id not in self.running:
                    self._activate_granted()  # its grant may have landed meanwhile
                if cmd.request_id not in self.running:
                    self.admission.ack(cmd, ok=False)
                    continue
                t0 = time.perf_counter()
                pages = execute_command(self.hierarchy, cmd)
                self.stats.phase(f"command:{cmd.kind.value}", time.perf_counter() - t0)
                self.stats.command(cmd.kind.value, pages)
                self.admission.ack(cmd, ok=True)

    def _emit(self, run: RequestRun, tokens: list[int], write_buf: bool = True) -> list[int]:
        """Emit ``tokens`` (capped at the request's remaining budget); returns what was
        emitted. ``write_buf=False``: the caller writes ``_token_buf`` itself (``_round``
        writes a whole batch's tokens with one copy)."""
        tokens = tokens[: run.remaining]
        now = self.clock()
        start = len(run.tokens)
        if write_buf:
            self._token_buf[run.slot, start: start + len(tokens)] = torch.tensor(
                tokens, dtype=torch.int64, device=self.config.device)
        run.output.extend(tokens)
        run.tokens.extend(tokens)
        run.emit_times.extend([now] * len(tokens))
        self.stats.tokens(len(tokens))
        if run.on_tokens is not None and tokens:
            run.on_tokens(run, tokens, now)
        return tokens

    def _fail(self, run: RequestRun, error: DHiSparseError) -> None:
        """A granted request that could not be activated: its grant goes back to the
        admission and ``on_finish`` sees ``run.error``."""
        self.admission.release(run.request_id)
        run.error = error
        run.phase, run.finished_at = Phase.FINISHED, self.clock()
        self.failed.append(run)
        log.warning("request %s failed at activation: %s", run.request_id, error)
        if run.on_finish is not None:
            run.on_finish(run)

    def _finish(self, run: RequestRun) -> None:
        t0 = time.perf_counter()
        self.hierarchy.release(run.request_id)
        self.index.close(run.slot)
        self.admission.release(run.request_id)
        del self.kv.request_of[run.slot]
        del self.running[run.request_id]
        self._free_slots.append(run.slot)
        run.phase, run.finished_at = Phase.FINISHED, self.clock()
        self.finished.append(run)
        self.stats.finish()
        self.stats.phase("finish", time.perf_counter() - t0)
        if run.on_finish is not None:
            run.on_finish(run)

    # -- decode rounds ----------------------------------------------------------------------
    def _round(self, batch: list[RequestRun]) -> None:
        dev = self.config.device
        B = len(batch)
        slots = device_ints([r.slot for r in batch], dev)
        n = device_ints([r.committed for r in batch], dev)
        if self.drafter is not None:
            caps = [max(1, min(self._block_cap(r.spec), r.remaining)) for r in batch]
            histories = [self._token_buf[r.slot, : r.committed + 1] for r in batch]
            gens = [r.generator for r in batch] if self.config.temperature > 0 else None
            proposal = self.drafter.propose([r.slot for r in batch], histories, caps, gens)
            tokens, nq = proposal.tokens, proposal.num_queries
        else:
            tokens = device_ints([[r.tokens[r.committed]] for r in batch], dev)
            nq = torch.ones(B, dtype=torch.int64, device=dev)
        t0 = self.clock()
        nq_host = nq.tolist() if self.drafter is not None else [1] * B
        self.kv.begin_round([r.request_id for r in batch], nq_host, slots)
        logits = self.model.forward(tokens, n, nq, slots, self.kv, self.index)
        self.kv.finish_round()
        self.stats.resolver(self.kv.counts)
        accepted, bonus = self._accept(batch, tokens, nq, logits,
                                       proposal.probs if self.drafter is not None else None)
        # one device→host read for the whole batch: [accepted, bonus, tokens[1:]] per row
        host = torch.cat([accepted.view(-1, 1).to(tokens.dtype), bonus.view(-1, 1).to(
            tokens.dtype), tokens[:, 1:]], dim=1).tolist()
        rows: list[int] = []
        cols: list[int] = []
        vals: list[int] = []
        for run, (a, bonus_b, *drafted), q in zip(batch, host, nq_host, strict=True):
            self._commit(run, run.committed + 1 + a)
            start = len(run.tokens)
            emitted = self._emit(run, [*drafted[:a], bonus_b], write_buf=False)
            rows.extend([run.slot] * len(emitted))
            cols.extend(range(start, start + len(emitted)))
            vals.extend(emitted)
            run.rounds += 1
            self.stats.round(a + 1, q)
        if vals:  # every emitted token of the round into the device history, one copy
            idx = device_ints([rows, cols, vals], dev)
            self._token_buf[idx[0], idx[1]] = idx[2]
        self.stats.step_time(self.clock() - t0)

    def _accept(self, batch, tokens, nq, logits, draft_probs):
        k_max = tokens.shape[1]
        if self.config.temperature == 0:
            v = greedy_accept(tokens, nq, logits, k_max)
            return v.accepted, v.bonus
        probs = torch.softmax(logits.float() / self.config.temperature, dim=-1)
        if draft_probs is None:
            draft_probs = torch.zeros(len(batch), 0, probs.shape[-1], device=probs.device)
        v = speculative_accept(tokens, nq, probs, draft_probs, [r.generator for r in batch],
                               k_max)
        return v.accepted, v.bonus

    def _commit(self, run: RequestRun, n_new: int) -> None:
        """Eq. 7: rows of positions < n' become history; rejected rows are dropped (I5);
        completed tail pages are backed up after verification (offload policies)."""
        p = self.config.page_rows
        for group in self.hierarchy.groups.values():
            commit_rows(group, run.request_id, n_new)
            state = group.request(run.request_id)
            done = n_new // p - state.tail_lo // p
            if self.policy.uses_host and done > 0:
                self.stats.backup_bytes(backup(group, run.request_id, max_pages=done)
                                        * group.spec.row_bytes * group.spec.payload_layers)
        self.index.truncate(run.slot, n_new)
        if self.drafter is not None:
            self.drafter.rollback(run.slot, n_new)
        run.committed = n_new


def _same_f32(a: float, b: float) -> bool:
    """Equal as the wire's float32 (a client's 0.3 arrives as 0.30000001192...; a value past
    float32's range packs as inf, as the wire would carry it)."""
    (fa,), (fb,) = struct.unpack("f", struct.pack("f", a)), struct.unpack("f", struct.pack("f", b))
    return fa == fb
