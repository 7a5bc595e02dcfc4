"""Hierarchy: admission to every source group at once, or to none."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import InvalidArgument, NotFound, ResourceExhausted
from services.decode.hierarchy import (
    Hierarchy,
    HierarchyConfig,
    InProcessBackingProvider,
    SourceSpec,
)
from services.decode.hierarchy.invariants import assert_no_leak


def make(device: str, num_pages: int = 16) -> tuple[Hierarchy, InProcessBackingProvider]:
    cfg = HierarchyConfig(num_pages=num_pages, page_rows=4, hot_slots=3, tail_rows=7,
                          staging_rows=4, device=device)
    provider = InProcessBackingProvider()
    specs = [SourceSpec("glm", 8, payload_layers=3), SourceSpec("dsv", 16, payload_layers=1)]
    return Hierarchy(cfg, specs, provider), provider


def rows(n: int, row_bytes: int, layers: int) -> list[torch.Tensor]:
    return [torch.randint(0, 256, (n, row_bytes), dtype=torch.uint8) for _ in range(layers)]


def test_admit_and_release_span_every_group(device: str) -> None:
    h, provider = make(device)
    h.admit("a", 16, {"glm": rows(9, 8, 3), "dsv": rows(9, 16, 1)})
    assert sorted(provider.histories) == [("a", 0), ("a", 1), ("a", 2), ("a", 3)]
    assert h.group("glm").request("a").page_ready[:2].all()
    h.release("a")
    assert not provider.histories
    for g in h.groups.values():
        assert g.pages.counts()["free"] == 16 and not g.requests
        assert_no_leak(g)


def test_a_release_one_group_refuses_changes_no_group(device: str) -> None:
    """A resolve of the second group whose readers have not finished: the release is
    refused and the request stays in every group, its histories open; once they finish
    it frees everywhere."""
    from services.common.errors import FailedPrecondition
    from services.decode.hierarchy import resolve

    h, provider = make(device)
    h.admit("a", 16, {"glm": rows(9, 8, 3), "dsv": rows(9, 16, 1)})
    dsv = h.group("dsv")
    resolve(dsv, ["a"], torch.tensor([[[0, 1, 2]]], device=device),
            torch.tensor([[9]], device=device))
    before = {n: g.pages.counts() for n, g in h.groups.items()}
    with pytest.raises(FailedPrecondition, match="request_id='a': readers of epoch"):
        h.release("a")
    assert all("a" in g.requests for g in h.groups.values())
    assert {n: g.pages.counts() for n, g in h.groups.items()} == before
    assert len(provider.histories) == 4
    h.readers_finished()
    h.release("a")
    assert not provider.histories and all(not g.requests for g in h.groups.values())


def test_failed_admission_is_rolled_back_everywhere(device: str) -> None:
    h, provider = make(device)
    with pytest.raises(InvalidArgument, match=r"history\[0\] has dtype=torch.uint8 shape=\(9, 8\)"):
        h.admit("a", 16, {"glm": rows(9, 8, 3), "dsv": rows(9, 8, 1)})  # dsv rows are 16 B
    assert not provider.histories
    assert all(not g.requests and g.pages.counts()["free"] == 16 for g in h.groups.values())
    with pytest.raises(InvalidArgument, match=r"history groups=\['glm'\] must be exactly"):
        h.admit("a", 16, {"glm": rows(9, 8, 3)})
    with pytest.raises(NotFound, match="group='x'"):
        h.group("x")
    with pytest.raises(NotFound, match="request_id='a'"):
        h.release("a")


def test_admission_waits_when_any_group_is_full(device: str) -> None:
    h, _ = make(device, num_pages=4)  # 3 required pages per request
    h.admit("a", 8)
    assert not h.can_admit(0)
    with pytest.raises(ResourceExhausted, match="does not fit every group"):
        h.admit("b", 8)
    assert ["a"] == list(h.group("dsv").requests)


def test_rollback_of_a_failed_admission_ignores_another_requests_pending_plan(
        device: str) -> None:
    """Admission "b" fails in its second group while "a"'s plan in the first group still
    waits for apply_copies: "b" is taken back from the first group all the same (release
    would refuse there), the original error surfaces and nothing of "b" stays open."""
    from services.decode.hierarchy import apply_copies, resolve

    h, provider = make(device)
    h.admit("a", 16, {"glm": rows(9, 8, 3), "dsv": rows(9, 16, 1)}, max_optional=0)
    glm = h.group("glm")
    sel = torch.tensor([[[0, 1, 5]]], device=glm.device)  # host rows: copies pending
    plan = resolve(glm, ["a"], sel, torch.tensor([[9]], device=glm.device))
    assert glm.pending_layers and plan.copy_rows.numel() == 3
    free = {name: g.pages.counts()["free"] for name, g in h.groups.items()}
    with pytest.raises(InvalidArgument, match=r"history\[0\] has dtype=torch.uint8 shape=\(9, 8\)"):
        h.admit("b", 16, {"glm": rows(9, 8, 3), "dsv": rows(9, 8, 1)})  # dsv rows are 16 B
    assert all("b" not in g.requests for g in h.groups.values())
    assert sorted(provider.histories) == [("a", 0), ("a", 1), ("a", 2), ("a", 3)]
    assert {name: g.pages.counts()["free"] for name, g in h.groups.items()} == free
    for layer in range(3):
        apply_copies(glm, plan, layer)
    h.readers_finished()
    h.release("a")
    for g in h.groups.values():
        assert_no_leak(g)


def test_rolled_back_admission_keeps_prefills_histories(device: str) -> None:
    """history=None: prefill left "b"'s rows in the host histories of both groups, but
    dsv's miss row 5. The admission re-attaches glm's, is taken back from glm when dsv
    fails, and must not free what prefill wrote (a retry needs it); nothing else leaks."""
    from services.common.errors import FailedPrecondition

    h, provider = make(device)
    for group in h.groups.values():
        for sid in group.source_ids:
            backing = provider.open("b", sid, group.spec.row_bytes, 16)
            backing.write(0, torch.full((8, group.spec.row_bytes), sid, dtype=torch.uint8))
            backing.commit(0, 8 if group.name == "glm" else 5)
    before = sorted(provider.histories)
    free = {name: list(g.pages.free_ids) for name, g in h.groups.items()}
    with pytest.raises(FailedPrecondition, match=r"host rows \[0, 8\) of layer=0"):
        h.admit("b", 16, None, imported_rows=8)
    assert sorted(provider.histories) == before
    assert all("b" not in g.requests for g in h.groups.values())
    # glm's pages are back at the front of its free list in order: the pool is as before
    assert {name: list(g.pages.free_ids) for name, g in h.groups.items()} == free
    for group in h.groups.values():
        assert_no_leak(group)

