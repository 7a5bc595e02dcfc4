"""LeaseTable: expiry order against a dict model, and a heap that stays bounded."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.kvstore.leases import STALE_MARGIN, LeaseTable

OPS = st.lists(st.tuples(st.sampled_from(["renew", "drop", "expire"]), st.integers(0, 7),
                         st.integers(0, 50)), max_size=300)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_expiry_matches_a_dict_model(ops: list[tuple[str, int, int]]) -> None:
    table, model = LeaseTable(), {}
    for op, key, t in ops:
        if op == "renew":
            table.renew(key, float(t))
            model[key] = float(t)
        elif op == "drop":
            table.drop(key)
            model.pop(key, None)
        else:
            due = table.pop_expired(float(t))
            want = sorted((d, k) for k, d in model.items() if d <= t)
            assert sorted((model[k], k) for k in due) == want
            for k in due:
                del model[k]
        assert len(table) == len(model)
        assert all(table.deadline(k) == d for k, d in model.items())


def test_a_renew_loop_keeps_the_heap_bounded() -> None:
    """Every renew pushes an entry; the stale ones are rebuilt away, not kept until their
    deadlines (a client renewing every second for an hour-long lease)."""
    table = LeaseTable()
    for i in range(20_000):
        table.renew("a", 3600.0 + i)
        table.renew(("b", i % 3), 7200.0 + i)
        assert len(table._heap) <= 2 * len(table) + STALE_MARGIN + 1
    for i in range(3):
        table.drop(("b", i))
    assert table.pop_expired(3600.0 + 19_998) == []
    assert table.pop_expired(3600.0 + 19_999) == ["a"] and len(table) == 0
