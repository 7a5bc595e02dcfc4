"""``dhisparse status``: fetch the controller's GetState and render it with rich."""

from __future__ import annotations

import grpc

from services.common.gen.dhisparse.v1 import residency_pb2 as pb
from services.common.gen.dhisparse.v1 import residency_pb2_grpc


def fetch_state(address: str, include_requests: bool, token: str | None,
                timeout: float) -> pb.GetStateResponse:
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    with grpc.insecure_channel(address) as channel:
        stub = residency_pb2_grpc.ResidencyStub(channel)
        return stub.GetState(pb.GetStateRequest(include_requests=include_requests),
                             timeout=timeout, metadata=metadata)


def render_state(state: pb.GetStateResponse, include_requests: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"residency ledger — policy {state.policy}, reclaim order "
                        f"{state.reclaim_order}, {state.waiting_admissions} waiting")
    for col in ("worker", "alive", "capacity", "reserve", "required", "optional", "ready",
                "free", "slots", "coverage", "reclaimed", "populated", "seen"):
        table.add_column(col, justify="left" if col == "worker" else "right")
    for w in state.workers:
        table.add_row(
            w.worker_id, "yes" if w.alive else "no", str(w.capacity_pages),
            str(w.reserve_pages), str(w.required_pages), str(w.optional_pages),
            str(w.ready_pages), str(w.free_pages), f"{w.allocated_slots}/{w.request_slots}",
            f"{w.coverage:.1%}", str(w.reclaimed_pages_total), str(w.populated_pages_total),
            f"{w.last_seen_s:.1f}s ago")
    console = Console()
    console.print(table)
    if include_requests:
        reqs = Table(title="requests")
        for col in ("worker", "request", "required", "optional", "ready", "history", "backed",
                    "pending", "reclaiming"):
            reqs.add_column(col)
        for w in state.workers:
            for r in w.requests:
                reqs.add_row(w.worker_id, r.request_id, str(r.required_pages),
                             str(r.optional_pages), str(r.ready_pages), str(r.history_pages),
                             str(r.backed_pages), r.pending or "-", "yes" if r.reclaiming else "")
        console.print(reqs)
