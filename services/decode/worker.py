"""The decode worker: one :class:`Engine` on one dedicated thread, fed through a queue.

::

    gRPC handlers (event loop)            engine thread (owns the engine, never blocks long)
    ─────────────────────────             ──────────────────────────────────────────────
    submit(spec) ──job──▶ inbox ────────▶ engine.submit (validation errors go back)
    await events ◀── call_soon_threadsafe ─ on_tokens / on_finish callbacks
    cancel(rid)  ──job──▶ inbox ────────▶ withdraw the admission, or cap the output
                                          step() loop; failed/expired tickets fail their
                                          request; metrics deltas + gauge snapshot

Admission is the residency controller over gRPC (``--residency``) or an in-process core
(standalone). Host backing is the node's kvstore (``--kvstore``, mapped shared memory) or
the worker's own memory. Engine request ids are ``<worker>.<incarnation>.<n>:<client id>``
so that the cluster-wide controller and the node-wide kvstore never see two live requests
with one id, and a restarted worker never re-attaches a dead incarnation's histories.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch

from services.common import errors
from services.common.gen.dhisparse.v1 import residency_pb2 as rpb
from services.common.logging import get_logger
from services.decode.config import DecodeConfig
from services.decode.engine.admission import LocalAdmission
from services.decode.engine.engine import Engine
from services.decode.engine.request import GenerateSpec, Phase, RequestRun
from services.decode.metrics import DecodeMetrics, WorkerGauges
from services.kvstore.keys import MAX_ID_LEN
from services.residency.core import Ticket, TicketState

log = get_logger("decode.worker")
T = TypeVar("T")
IDLE_WAIT_S = 0.02        # idle engine: wait this long for work between steps
ADMIT_WAIT_S = 0.002      # only waiting requests: poll admission this often
GAUGE_PERIOD_S = 0.2


def safe_id(text: str) -> str:
    """``text`` in the id alphabet of the kvstore and the controller ([A-Za-z0-9._:-])."""
    return re.sub(r"[^A-Za-z0-9._:-]", "_", text)[:200]


@dataclass(slots=True)
class FailedTicket:
    """An admission that failed before it could wait (e.g. larger than the pool)."""

    error: errors.DHiSparseError
    state: TicketState = TicketState.CANCELLED
    grant: None = None


class StandaloneAdmission(LocalAdmission):
    """In-process admission for a worker without a controller; adds ``cancel`` and turns
    an impossible request into a failed ticket instead of an exception in ``step``."""

    def admit(self, request_id: str, required_pages: int,
              history_pages: int) -> Ticket | FailedTicket:
        try:
            return super().admit(request_id, required_pages, history_pages)
        except errors.DHiSparseError as exc:
            return FailedTicket(exc)

    def cancel(self, ticket: Ticket | FailedTicket) -> None:
        if isinstance(ticket, Ticket) and not self.core.cancel(ticket) \
                and ticket.state is TicketState.GRANTED:
            self.core.release(ticket.spec.request_id)


@dataclass(slots=True)
class TokenBatch:
    tokens: list[int]
    first_index: int
    time_s: float          # since the request arrived
    round: int


@dataclass(slots=True)
class Finished:
    reason: str = "length"


class ClientStream:
    """Events of one request, handed from the engine thread to the handler's loop."""

    def __init__(self, client_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.client_id = client_id
        self.loop = loop
        self.queue: asyncio.Queue[TokenBatch | Finished | BaseException] = asyncio.Queue()
        self.run: RequestRun | None = None

    def push(self, item: TokenBatch | Finished | BaseException) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:      # the loop is gone (shutdown): nobody is listening
            pass


class DecodeWorker:
    def __init__(self, config: DecodeConfig, metrics: DecodeMetrics | None = None,
                 on_fatal: Callable[[BaseException], None] | None = None) -> None:
        self.config = config
        self.worker_id = config.worker_id
        self.incarnation = secrets.token_hex(3)
        self.metrics = metrics or DecodeMetrics(config.worker_id)
        self.on_fatal = on_fatal
        ecfg = config.engine_config()
        self.engine_config = ecfg
        self.provider = self._provider()
        self.admission = self._admission()
        self.engine = Engine(ecfg, self.provider, self.admission, config.worker_id)
        self._time_resolves()
        for name, length, seed in config.prefix_specs():
            g = torch.Generator().manual_seed(seed)
            tokens = torch.randint(ecfg.model.vocab, (length,), generator=g).tolist()
            self.engine.register_prefix(name, tokens)
        self._inbox: queue.Queue[tuple[Callable[[], Any], concurrent.futures.Future]] = \
            queue.Queue()
        self._streams: dict[str, ClientStream] = {}     # engine request id -> stream
        self._client_ids: dict[str, str] = {}            # client id -> engine request id
        self._last: dict[str, float] = {}
        self._submitted = 0
        self._gauge_at = 0.0
        self._stop = threading.Event()
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)

    # -- construction ----------------------------------------------------------------------
    def _provider(self) -> Any:
        if not (self.config.kvstore and self.engine_config.policy_.uses_host):
            return None            # resident policies, or standalone: in-process backing
        from services.decode.host_backing import RetryingProvider
        from services.kvstore.client import KVStoreClient
        client = KVStoreClient(self.config.kvstore,
                               safe_id(f"{self.worker_id}.{self.incarnation}"),
                               token=self.config.token,
                               lease_seconds=self.config.lease_seconds)
        return RetryingProvider(client)

    def _admission(self) -> Any:
        hcfg = self.engine_config.hierarchy_config()
        if not self.config.residency:
            return StandaloneAdmission(self.worker_id, hcfg.num_pages, hcfg.reserve_pages,
                                       self.engine_config.max_requests)
        from services.decode.remote_admission import RemoteAdmission, WorkerPool
        pool = WorkerPool(self.worker_id, self.config.advertise or
                          f"{self.config.host}:{self.config.port}", hcfg.num_pages,
                          hcfg.reserve_pages, self.engine_config.max_requests,
                          self.engine_config.page_rows, self.engine_config.page_bytes)
        return RemoteAdmission(self.config.residency, pool, self._live_reports,
                               self.config.admit_timeout_seconds, token=self.config.token)

    def _time_resolves(self) -> None:
        """Observe ``dhisparse_resolver_seconds`` around each resolve of the engine's KV."""
        resolve, hist = self.engine.kv.resolve, self.metrics.resolver_seconds.labels(
            self.worker_id)

        def timed(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return resolve(*args)
            finally:
                hist.observe(time.perf_counter() - t0)
        self.engine.kv.resolve = timed  # type: ignore[method-assign]

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if hasattr(self.admission, "close"):
            self.admission.close()
        if self.provider is not None:
            self.provider.shutdown()

    # -- API for the servicer (any thread / event loop) -------------------------------------
    def call(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``fn`` on the engine thread."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        if self.failure is not None or self._stop.is_set():
            fut.set_exception(errors.Unavailable(f"worker {self.worker_id} is shutting down"))
        else:
            self._inbox.put((fn, fut))
        return fut

    async def submit(self, spec: GenerateSpec) -> ClientStream:
        """Queue a request; raises its validation error (nothing is queued then)."""
        stream = ClientStream(spec.request_id, asyncio.get_running_loop())
        return await asyncio.wrap_future(self.call(lambda: self._submit(spec, stream)))

    def cancel(self, client_id: str) -> None:
        """The client went away: withdraw or stop the request (fire and forget)."""
        self.call(lambda: self._cancel(client_id))

    async def status(self) -> dict[str, Any]:
        return await asyncio.wrap_future(self.call(self._status))

    # -- engine thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        torch.set_num_threads(self.config.threads)
        try:
            while not self._stop.is_set():
                e = self.engine
                wait = IDLE_WAIT_S if e.idle else (ADMIT_WAIT_S if not e.running else 0.0)
                self._run_jobs(wait)
                e.step()
                e.finished.clear()  # a long-running worker keeps no finished request (its
                e.failed.clear()    # stream got everything and metrics counted it)
                self._check_waiting()
                self._publish()
        except BaseException as exc:       # the engine's state is unknown now: fail loudly
            log.exception("engine thread failed")
            self.failure = exc
            for stream in list(self._streams.values()):
                stream.push(errors.Unavailable(f"worker {self.worker_id} failed: {exc!r}"))
            if self.on_fatal is not None:
                self.on_fatal(exc)
        finally:
            self._drain_jobs()

    def _run_jobs(self, wait: float) -> None:
        try:
            job = self._inbox.get(timeout=wait) if wait > 0 else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            fn, fut = job
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as exc:
                    fut.set_exception(exc)
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _drain_jobs(self) -> None:
        while True:
            try:
                _, fut = self._inbox.get_nowait()
            except queue.Empty:
                return
            if fut.set_running_or_notify_cancel():
                fut.set_exception(errors.Unavailable(f"worker {self.worker_id} stopped"))

    def _check_id_fits(self, client_id: str) -> None:
        """The engine's id (this worker's prefix + the client's) must fit the kvstore's and
        the controller's id limit: refused here, not after the admission was granted."""
        prefix = self._next_prefix()
        if len(client_id) > MAX_ID_LEN - len(prefix):
            raise errors.InvalidArgument(
                f"request_id has {len(client_id)} characters; the limit on worker "
                f"{self.worker_id} is {MAX_ID_LEN - len(prefix)} ({MAX_ID_LEN} less the "
                f"{len(prefix)} of its prefix {prefix!r})")

    def _next_prefix(self) -> str:
        """What the next submission's engine id starts with."""
        return f"{self.worker_id}.{self.incarnation}.{self._submitted + 1}:"

    def _engine_id(self, client_id: str) -> str:
        prefix = self._next_prefix()
        self._submitted += 1
        return safe_id(prefix + client_id)

    def _submit(self, spec: GenerateSpec, stream: ClientStream) -> ClientStream:
        client_id = spec.request_id
        if client_id in self._client_ids:
            raise errors.InvalidArgument(f"request_id={client_id!r} is already in flight on "
                                         f"worker {self.worker_id}")
        self._check_fits(spec)
        self._check_id_fits(client_id)
        inner = replace(spec, request_id=self._engine_id(client_id))
        stream.run = self.engine.submit(inner, on_tokens=self._on_tokens,
                                        on_finish=self._on_finish)
        self._streams[inner.request_id] = stream
        self._client_ids[client_id] = inner.request_id
        return stream

    def _check_fits(self, spec: GenerateSpec) -> None:
        """A request whose required pages exceed the whole pool can never be admitted."""
        cfg = self.engine_config
        if spec.prefix_id and spec.prefix_id not in self.engine.prefixes:
            return                                  # engine.submit raises NotFound
        n = len(spec.prompt) if spec.prompt is not None else \
            self.engine.prefixes[spec.prefix_id].length
        rows = n + spec.max_new_tokens + cfg.k_max
        if rows > cfg.max_context:
            return                                  # engine.submit names max_context
        need, pool = cfg.required_pages_for(rows), cfg.num_pages - cfg.reserve_pages
        if need > pool:
            raise errors.ResourceExhausted(
                f"prompt ({n}) + max_new_tokens ({spec.max_new_tokens}) needs {need} required "
                f"pages under policy={cfg.policy}; this worker's KV pool admits at most {pool} "
                f"(--kv-memory={cfg.kv_memory})")

    def _on_tokens(self, run: RequestRun, tokens: list[int], t: float) -> None:
        stream = self._streams.get(run.request_id)
        first = len(run.output) - len(tokens)
        rnd = 0 if first == 0 else run.rounds + 1
        self.metrics.output_tokens.labels(self.worker_id).inc(len(tokens))
        if rnd:
            self.metrics.tokens_per_round.labels(self.worker_id).observe(len(tokens))
        if stream is not None:
            stream.push(TokenBatch(list(tokens), first, t - run.arrival, rnd))

    def _on_finish(self, run: RequestRun) -> None:
        if run.error is not None:  # ended before its first token: the client gets the error
            self._forget(run, run.error)
            return
        w = self.worker_id
        if run.ttft is not None:
            self.metrics.ttft.labels(w).observe(run.ttft)
        if run.tpot is not None:
            self.metrics.tpot.labels(w).observe(run.tpot)
        stream = self._streams.pop(run.request_id, None)
        if stream is not None:
            self._client_ids.pop(stream.client_id, None)
            stream.push(Finished())

    def _forget(self, run: RequestRun, error: BaseException | None) -> None:
        stream = self._streams.pop(run.request_id, None)
        if stream is not None:
            self._client_ids.pop(stream.client_id, None)
            if error is not None:
                stream.push(error)

    def _cancel(self, client_id: str) -> None:
        rid = self._client_ids.get(client_id)
        stream = self._streams.get(rid) if rid else None
        run = stream.run if stream is not None else None
        if run is None:
            return
        if run.phase is Phase.WAITING:
            if run.ticket is not None and hasattr(self.admission, "cancel"):
                self.admission.cancel(run.ticket)
            self.engine.waiting.remove(run)
            self._forget(run, None)
        elif run.phase is Phase.RUNNING:
            run.spec.max_new_tokens = len(run.output)   # finishes (and releases) next step
            self._forget(run, None)

    def _check_waiting(self) -> None:
        """Fail requests whose admission failed or ran past the admission deadline."""
        now = self.engine.clock()
        for run in list(self.engine.waiting):
            error = getattr(run.ticket, "error", None)
            if error is None and now - run.arrival > self.config.admit_timeout_seconds:
                error = errors.DeadlineExceeded(
                    f"request {self._client_of(run)}: not admitted within "
                    f"--admit-timeout-seconds={self.config.admit_timeout_seconds:g}")
                if run.ticket is not None and hasattr(self.admission, "cancel"):
                    self.admission.cancel(run.ticket)
            if error is not None:
                self.engine.waiting.remove(run)
                self._forget(run, error)

    def _client_of(self, run: RequestRun) -> str:
        stream = self._streams.get(run.request_id)
        return stream.client_id if stream is not None else run.request_id

    # -- metrics (engine thread) -------------------------------------------------------------
    def _delta(self, key: str, value: float) -> float:
        d = value - self._last.get(key, 0.0)
        self._last[key] = value
        return d

    def _publish(self) -> None:
        e, m, w = self.engine, self.metrics, self.worker_id
        counts = e.kv.counts
        for source in ("tail", "optional", "hot", "host"):
            if d := self._delta(source, getattr(counts, source)):
                m.selected_rows.labels(w, source).inc(d)
        if d := self._delta("host_bytes", e.kv.copied_bytes):
            m.host_fetch_bytes.labels(w).inc(d)
        backup = e.stats.backup_bytes_total + e.stats.commands.get("backup", 0) * \
            self.engine_config.page_bytes
        if d := self._delta("backup", backup):
            m.backup_bytes.labels(w).inc(d)
        if d := self._delta("accepted", e.stats.accepted_tokens):
            m.accepted_tokens.labels(w).inc(d)
        now = time.monotonic()
        if now - self._gauge_at < GAUGE_PERIOD_S:
            return
        self._gauge_at = now
        group = next(iter(e.hierarchy.groups.values()))
        selected = counts.selected
        m.publish(WorkerGauges(
            pages=tuple(group.pages.counts().items()), slots_allocated=len(e.running),
            slots_capacity=self.engine_config.max_requests, coverage=e.coverage(),
            host_fetch_share=counts.host / selected if selected else 0.0))

    # -- reports for the residency controller ------------------------------------------------
    def _live_reports(self, live: dict[str, Any]) -> list[rpb.RequestPages]:
        """Page accounts of the granted requests (a restarted controller rebuilds from
        them). Computed on the engine thread; called from the session thread."""
        if not live:
            return []
        if threading.current_thread() is self._thread or not self._thread.is_alive():
            return self._reports_now(live)
        try:
            return self.call(lambda: self._reports_now(live)).result(timeout=10)
        except Exception:
            log.warning("engine busy; reporting granted pages instead of live ones")
            return [self._granted_report(rid, t) for rid, t in live.items()]

    def _reports_now(self, live: dict[str, Any]) -> list[rpb.RequestPages]:
        out = []
        group = next(iter(self.engine.hierarchy.groups.values()))
        p = self.engine_config.page_rows
        for rid, ticket in live.items():
            if rid not in group.requests:
                out.append(self._granted_report(rid, ticket))
                continue
            state = group.request(rid)
            hist = ticket.history_pages
            ready = int(state.page_ready[: state.eligible_pages].sum())
            mask = group.backed_mask(state)
            backed = sum(1 for g in range(state.eligible_pages)
                         if bool(mask[g * p: g * p + p].all()))
            out.append(rpb.RequestPages(request_id=rid, required_pages=ticket.required_pages,
                                        history_pages=hist, optional_pages=min(ready, hist),
                                        ready_pages=min(ready, hist),
                                        backed_pages=min(backed, hist)))
        return out

    @staticmethod
    def _granted_report(rid: str, ticket: Any) -> rpb.RequestPages:
        opt = min(ticket.grant.optional_pages, ticket.history_pages)
        return rpb.RequestPages(request_id=rid, required_pages=ticket.required_pages,
                                history_pages=ticket.history_pages, optional_pages=opt,
                                ready_pages=opt, backed_pages=ticket.history_pages - opt)

    # -- status ------------------------------------------------------------------------------
    def _status(self) -> dict[str, Any]:
        e = self.engine
        group = next(iter(e.hierarchy.groups.values()))
        pages = group.pages.counts()
        counts = e.kv.counts
        return dict(worker_id=self.worker_id, policy=self.engine_config.policy,
                    active_requests=len(e.running), waiting_requests=len(e.waiting),
                    capacity_pages=group.pages.num_pages, required_pages=pages["required"],
                    optional_pages=pages["optional"], free_pages=pages["free"],
                    coverage=e.coverage(), output_tokens=e.stats.output_tokens,
                    host_fetch_share=counts.host / counts.selected if counts.selected else 0.0,
                    prefixes=sorted(e.prefixes))
