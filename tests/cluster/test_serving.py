"""A real cluster (kvstore + residency + 2 decode workers) serves concurrent Generate
calls: tokens equal in-process resident serving, /metrics of every service matches the
workload, bad inputs get clear status codes."""

from __future__ import annotations

from collections import Counter

import grpc
import pytest

from services.cli.cluster import metric_sum
from services.common.gen.dhisparse.v1 import decode_pb2 as pb
from tests.cluster import harness as h
from tests.deploy import contract as c

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with h.start(tmp_path_factory.mktemp("serving")) as cl:
        yield cl


def test_concurrent_generate_equals_in_process_resident_serving(cluster) -> None:
    prompts = [h.prompt(i, 48 + 9 * i) for i in range(8)]
    results = h.generate_many(cluster, prompts, max_new=20, tag="eq")
    assert [r.error for r in results] == [None] * 8
    assert [r.tokens for r in results] == h.reference(prompts, 20)
    assert {r.worker for r in results} == {"decode-0", "decode-1"}
    for r in results:
        assert r.indices == list(range(20))
        assert r.times == sorted(r.times) and r.ttft == r.times[0] > 0
        assert r.finish == pb.GenerateResponse.LENGTH


def test_registered_prefix_equals_the_same_prompt(cluster) -> None:
    target = cluster.plan.decode_targets[1]
    via_prefix = h.generate(target, "pfx", prefix_id="sys", max_new=12)
    assert via_prefix.error is None
    assert via_prefix.tokens == h.reference([h.prefix_tokens(40, 3)], 12)[0]


def test_metrics_of_every_service_match_the_workload(cluster) -> None:
    names = [s.name for s in cluster.plan.specs]
    before = {n: h.metrics(cluster, n) for n in names}
    prompts = [h.prompt(100 + i, 72) for i in range(6)]
    results = h.generate_many(cluster, prompts, max_new=16, tag="met")
    assert [r.error for r in results] == [None] * 6
    after = {n: h.metrics(cluster, n) for n in names}

    def delta(proc: str, series: str, **labels: str) -> float:
        return (metric_sum(after[proc], series, **labels)
                - metric_sum(before[proc], series, **labels))

    per_worker = Counter()
    for r in results:
        per_worker[r.worker] += len(r.tokens)
    for w in ("decode-0", "decode-1"):
        m = after[w]
        exposed = {name for name, _ in m}
        for family in c.WORKER_SIDE - {"dhisparse_admission_wait_seconds",
                                       "dhisparse_reclaimed_pages_total",
                                       "dhisparse_populated_pages_total"}:
            kind = c.SECTION5[family][0]
            assert c.exposed_names(family, kind) <= exposed, (w, family)
        assert all(dict(lbls).get("worker") == w for name, lbls in m
                   if name.startswith("dhisparse_")), f"{w}: a series without its worker label"
        assert delta(w, "dhisparse_output_tokens_total", worker=w) == per_worker[w]
        assert delta(w, "dhisparse_ttft_seconds_count", worker=w) == 3
        assert delta(w, "dhisparse_tpot_seconds_count", worker=w) == 3
        rounds = delta(w, "dhisparse_spec_emitted_tokens_per_round_count", worker=w)
        assert rounds == 3 * 15      # one token per round without speculation, first excluded
        selected = {s: delta(w, "dhisparse_selected_rows_total", worker=w, source=s)
                    for s in ("tail", "optional", "hot", "host")}
        assert selected["tail"] > 0 and sum(selected.values()) > 0, selected
        assert delta(w, "dhisparse_backup_bytes_total", worker=w) > 0   # pages backed up
        assert delta(w, "dhisparse_resolver_seconds_count", worker=w) > 0
        assert metric_sum(m, "dhisparse_request_slots", state="capacity") == 6
        pages = h.make_settings().kv_memory_pages()
        h.wait_for(lambda w=w, pages=pages: metric_sum(h.metrics(cluster, w), "dhisparse_pages",
                                          kind="free") == pages, 5, "every page free (idle)")
        assert 0 <= metric_sum(m, "dhisparse_host_fetch_share") <= 1
    res = after["residency"]
    assert delta("residency", "dhisparse_admission_wait_seconds_count") == 6
    h.wait_for(lambda: metric_sum(h.metrics(cluster, "residency"), "dhisparse_request_slots",
                                  state="allocated") == 0, 5, "every slot released")
    assert {dict(lbls)["worker"] for name, lbls in res if name == "dhisparse_pages"} == {
        "decode-0", "decode-1"}
    kv = after["kvstore"]
    assert metric_sum(kv, "dhisparse_kvstore_bytes", state="capacity") == 64 * 2**20
    h.wait_for(lambda: metric_sum(h.metrics(cluster, "kvstore"),
                                  "dhisparse_kvstore_histories") == 0, 5,
               "every history closed at release")


@pytest.mark.parametrize(("request_kw", "code", "needle"), [
    (dict(prompt_tokens=[], max_new_tokens=4), "INVALID_ARGUMENT", "prompt_tokens is empty"),
    (dict(prefix_id="nope", max_new_tokens=4), "NOT_FOUND", "prefix_id='nope'"),
    (dict(prompt_tokens=[1, 2, 3], max_new_tokens=400), "INVALID_ARGUMENT", "max_context=256"),
    (dict(prompt_tokens=[1, 2, 3], max_new_tokens=0), "INVALID_ARGUMENT", "max_new_tokens=0"),
    (dict(prompt_tokens=[1, 2, 3], max_new_tokens=4,
          speculation=pb.SpeculationSettings(enabled=True, block=4)),
     "INVALID_ARGUMENT", "exceeds K_max=1"),
    (dict(prompt_tokens=[1, 99], max_new_tokens=4), "INVALID_ARGUMENT", "0..63"),
    (dict(prompt_tokens=[1, 2, 3], max_new_tokens=4,
          sampling=pb.SamplingSettings(temperature=0.5)),
     "INVALID_ARGUMENT", "this worker samples at temperature=0.0"),
    (dict(prompt_tokens=[1, 2, 3], max_new_tokens=4,
          speculation=pb.SpeculationSettings(enabled=True, mode=5)),
     "INVALID_ARGUMENT", "speculation.mode=5: unknown"),
])
def test_bad_generate_inputs_get_clear_status_codes(cluster, request_kw, code, needle) -> None:
    import grpc as g

    from services.common.gen.dhisparse.v1 import decode_pb2_grpc
    with g.insecure_channel(cluster.plan.decode_targets[0]) as ch:
        with pytest.raises(grpc.RpcError) as info:
            list(decode_pb2_grpc.DecodeStub(ch).Generate(
                pb.GenerateRequest(request_id="bad", **request_kw), timeout=30))
    assert info.value.code().name == code
    assert needle in info.value.details()
    # nothing changed: the worker still serves, and the id is free again
    ok = h.generate(cluster.plan.decode_targets[0], "bad", h.prompt(1, 20), 2)
    assert ok.error is None and len(ok.tokens) == 2


def test_cancelled_client_releases_its_request(cluster) -> None:
    target = cluster.plan.decode_targets[0]
    from services.common.gen.dhisparse.v1 import decode_pb2_grpc
    with grpc.insecure_channel(target) as ch:
        call = decode_pb2_grpc.DecodeStub(ch).Generate(pb.GenerateRequest(
            request_id="gone", prompt_tokens=h.prompt(5, 60), max_new_tokens=150), timeout=60)
        next(call)
        call.cancel()
    h.wait_for(lambda: not any(w.requests for w in h.residency_state(cluster).workers),
               10, "the cancelled request to be released at the controller")
    h.wait_for(lambda: not h.kvstore_histories(cluster), 10, "its histories to close")
