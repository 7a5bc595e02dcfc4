"""The deployment contract and the parsers the deploy tests share.

The contract (what docker-compose.yml, deploy/k8s and deploy/prometheus.yml must agree on,
and what the service CLIs must accept):

* ports: ``PORTS`` (gRPC, metrics) per service;
* flags: ``KNOWN_FLAGS`` per ``dhisparse`` service subcommand (deploy files may pass only
  these; ``test_cli_contract`` checks the real CLIs list every flag actually passed);
* metric series: ``SECTION5`` (DESIGN.md §5), from which ``EXPOSED`` (the series names a
  Prometheus scrape shows: histograms as ``_bucket``/``_sum``/``_count``) is derived.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
DEPLOY = REPO / "deploy"
PROMETHEUS = DEPLOY / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "dhisparse.json"
GRAFANA_PROVISIONING = DEPLOY / "grafana" / "provisioning"
K8S = DEPLOY / "k8s"

SERVICES = ("kvstore", "residency", "decode")
# service -> (gRPC port, metrics port)
PORTS = {"kvstore": (50051, 9101), "residency": (50052, 9102), "decode": (50053, 9103)}
# The uid every dhisparse container runs as (kvstore segments are 0600).
UID = 10001

COMMON_FLAGS = frozenset({
    "--host", "--port", "--metrics-port", "--token", "--tls-cert", "--tls-key",
    "--log-level", "--log-json", "--log-text",
})
KNOWN_FLAGS: dict[str, frozenset[str]] = {
    "kvstore": COMMON_FLAGS | {
        "--capacity", "--shm-dir", "--prefix", "--manifest-dir", "--default-lease-seconds",
        "--max-lease-seconds", "--max-chunk-bytes", "--preallocate", "--no-preallocate",
        "--port-file",
    },
    "residency": COMMON_FLAGS,
    "decode": COMMON_FLAGS | {"--residency", "--kvstore", "--device", "--policy", "--worker-id"},
}
# Boolean switches take no value.
SWITCHES = frozenset({"--log-json", "--log-text", "--preallocate", "--no-preallocate"})

# DESIGN.md §5: name -> (type, {label: allowed values or None for free-form}).
# Worker-side series also carry `worker` (WORKER_SIDE below).
SECTION5: dict[str, tuple[str, dict[str, frozenset[str] | None]]] = {
    "dhisparse_history_coverage_ratio": ("gauge", {}),
    "dhisparse_selected_rows_total": (
        "counter", {"source": frozenset({"tail", "optional", "hot", "host"})}),
    "dhisparse_host_fetch_share": ("gauge", {}),
    "dhisparse_host_fetch_bytes_total": ("counter", {}),
    "dhisparse_resolver_seconds": ("histogram", {}),
    "dhisparse_pages": ("gauge", {"kind": frozenset({"required", "optional", "free", "reserve"})}),
    "dhisparse_request_slots": ("gauge", {"state": frozenset({"allocated", "capacity"})}),
    "dhisparse_admission_wait_seconds": ("histogram", {}),
    "dhisparse_reclaimed_pages_total": ("counter", {}),
    "dhisparse_populated_pages_total": ("counter", {}),
    "dhisparse_backup_bytes_total": ("counter", {}),
    "dhisparse_spec_emitted_tokens_per_round": ("histogram", {}),
    "dhisparse_spec_accepted_tokens_total": ("counter", {}),
    "dhisparse_ttft_seconds": ("histogram", {}),
    "dhisparse_tpot_seconds": ("histogram", {}),
    "dhisparse_output_tokens_total": ("counter", {}),
    "dhisparse_kvstore_bytes": ("gauge", {"state": frozenset({"used", "capacity"})}),
    "dhisparse_kvstore_histories": ("gauge", {}),
}
WORKER_SIDE = frozenset(n for n in SECTION5 if not n.startswith("dhisparse_kvstore_"))
# Labels Prometheus attaches at scrape time (usable in `by (...)` / matchers).
TARGET_LABELS = frozenset({"instance", "job"})


def exposed_names(name: str, kind: str) -> set[str]:
    """The series names a scrape shows for a metric defined as ``name`` of type ``kind``
    (prometheus_client conventions: a counter ``x`` or ``x_total`` is exposed as ``x_total``)."""
    if kind == "counter":
        return {name.removesuffix("_total") + "_total"}
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    if kind == "summary":
        return {name, f"{name}_sum", f"{name}_count"}
    return {name}


# exposed series name -> its §5 family name
EXPOSED: dict[str, str] = {
    series: name for name, (kind, _) in SECTION5.items() for series in exposed_names(name, kind)
}


def family_labels(family: str) -> set[str]:
    labels = set(SECTION5[family][1])
    if family in WORKER_SIDE:
        labels.add("worker")
    return labels


# --------------------------------------------------------------------------- loading


def load_yaml(path: Path) -> Any:
    with path.open() as f:
        return yaml.safe_load(f)


def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE)


def prometheus() -> dict[str, Any]:
    return load_yaml(PROMETHEUS)


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    """Every document of every deploy/k8s/*.yaml as (file name, document)."""
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        with path.open() as f:
            for doc in yaml.safe_load_all(f):
                if doc is not None:
                    docs.append((path.name, doc))
    return docs


WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "Job")


def k8s_workloads() -> list[tuple[str, dict[str, Any]]]:
    return [(f, d) for f, d in k8s_docs() if d.get("kind") in WORKLOAD_KINDS]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


# --------------------------------------------------------------------------- invocations


@dataclass
class Invocation:
    """One ``dhisparse <sub> --flag value ...`` a deploy file runs."""

    origin: str                      # e.g. "docker-compose.yml:decode", "k8s decode.yaml:decode"
    sub: str
    flags: list[tuple[str, str | None]] = field(default_factory=list)

    def value(self, flag: str) -> str | None:
        values = [v for f, v in self.flags if f == flag]
        assert len(values) <= 1, f"{self.origin}: {flag} given {len(values)} times"
        return values[0] if values else None


def parse_invocation(origin: str, argv: list[str] | str) -> Invocation:
    """Parse a command line that must be ``dhisparse <service> [--flag [value]]...``."""
    if isinstance(argv, str):
        argv = shlex.split(argv)
    argv = [str(a) for a in argv]
    assert len(argv) >= 2 and argv[0] == "dhisparse", (
        f"{origin}: command {argv!r} does not run `dhisparse <service>`")
    sub = argv[1]
    assert sub in SERVICES, f"{origin}: `dhisparse {sub}` is not one of {SERVICES}"
    inv = Invocation(origin, sub)
    rest = argv[2:]
    i = 0
    while i < len(rest):
        token = rest[i]
        assert token.startswith("--"), (
            f"{origin}: unexpected positional argument {token!r} in {argv!r}")
        if "=" in token:
            flag, value = token.split("=", 1)
            inv.flags.append((flag, value))
            i += 1
        elif token in SWITCHES:
            inv.flags.append((token, None))
            i += 1
        else:
            assert i + 1 < len(rest) and not rest[i + 1].startswith("--"), (
                f"{origin}: flag {token} has no value in {argv!r}")
            inv.flags.append((token, rest[i + 1]))
            i += 2
    return inv


def compose_invocations() -> list[Invocation]:
    out = []
    for name, svc in compose()["services"].items():
        if "command" in svc:
            out.append(parse_invocation(f"docker-compose.yml:{name}", svc["command"]))
    return out


def is_dhisparse_image(image: str) -> bool:
    return image.split("/")[-1].startswith("dhisparse")


def k8s_containers() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(origin, workload, container) for every main container of every workload."""
    for fname, w in k8s_workloads():
        for c in pod_spec(w).get("containers", []):
            yield f"k8s {fname}:{w['metadata']['name']}/{c['name']}", w, c


def k8s_invocations() -> list[Invocation]:
    return [parse_invocation(origin, [*c.get("command", []), *c.get("args", [])])
            for origin, _, c in k8s_containers()]


def deploy_invocations() -> list[Invocation]:
    return compose_invocations() + k8s_invocations()


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    assert host and port.isdigit(), f"{address!r} is not HOST:PORT"
    return host, int(port)


# --------------------------------------------------------------------------- PromQL

_SELECTOR_RE = re.compile(r"(?<![A-Za-z0-9_:\"'])(dhisparse_[A-Za-z0-9_:]*)(?:\s*\{([^}]*)\})?")
_MATCHER_RE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*\"((?:[^\"\\]|\\.)*)\"\s*")
_BY_RE = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def dashboard_queries(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel (rows included), plus the
    templating queries as ("templating:<name>", query)."""
    out: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((p.get("title", "?"), t["expr"]))
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    for var in dash.get("templating", {}).get("list", []):
        q = var.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        for text in (q, var.get("definition")):
            if isinstance(text, str) and text:
                out.append((f"templating:{var['name']}", text))
    return out


def series_in(expr: str) -> list[str]:
    return [name for name, _ in _SELECTOR_RE.findall(expr)]


def selectors_in(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """(series, [(label, op, value)]) for every occurrence of a series: its ``{...}``
    selector's matchers, none for a bare series (which a check of matchers must not skip)."""
    out = []
    for name, body in _SELECTOR_RE.findall(expr):
        matchers = []
        for part in filter(str.strip, body.split(",")):
            m = _MATCHER_RE.fullmatch(part)
            assert m, f"cannot parse label matcher {part!r} in {expr!r}"
            matchers.append((m.group(1), m.group(2), m.group(3)))
        out.append((name, matchers))
    return out


def grouping_labels(expr: str) -> set[str]:
    return {lbl.strip() for group in _BY_RE.findall(expr) for lbl in group.split(",")
            if lbl.strip()}


# --------------------------------------------------------------------------- registries

_CTORS = {
    "Counter": "counter", "CounterMetricFamily": "counter",
    "Gauge": "gauge", "GaugeMetricFamily": "gauge",
    "Histogram": "histogram", "HistogramMetricFamily": "histogram",
    "Summary": "summary", "SummaryMetricFamily": "summary",
    "Info": "info", "InfoMetricFamily": "info", "Enum": "stateset",
}
# where each constructor takes its label names by position (prometheus_client's signatures)
_LABELS_AT = {"HistogramMetricFamily": 4, "SummaryMetricFamily": 4,
              "CounterMetricFamily": 3, "GaugeMetricFamily": 3, "InfoMetricFamily": 3}


@dataclass
class Defined:
    name: str
    kind: str
    labels: set[str] | None   # None: could not be read statically


def _const_strings(node: ast.AST | None, consts: dict[str, Any]) -> list[str] | None:
    if isinstance(node, ast.Name) and node.id in consts:
        node = consts[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        vals = [e.value for e in node.elts if isinstance(e, ast.Constant)]
        return vals if len(vals) == len(node.elts) else None
    return None


def defined_metrics(module: ModuleType) -> dict[str, Defined]:
    """The metrics a service's metrics module defines on its registry.

    Reads every prometheus_client constructor call (``Counter(...)``, ``Histogram(...)``,
    ``GaugeMetricFamily(...)`` in custom collectors, ...) whose name is a ``dhisparse_``
    string (literal or module constant), with its label names; plus, dynamically, every
    module-level ``CollectorRegistry``. This is what the module's ``/metrics`` exposes,
    without having to construct the service objects the registry is bound to.
    """
    from prometheus_client import CollectorRegistry

    tree = ast.parse(inspect.getsource(module))
    consts: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Name):
            consts[node.targets[0].id] = node.value
    found: dict[str, Defined] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        fname = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
            node.func, "id", None)
        if fname not in _CTORS:
            continue
        first = node.args[0]
        if isinstance(first, ast.Name) and isinstance(consts.get(first.id), ast.Constant):
            first = consts[first.id]
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)
                and first.value.startswith("dhisparse_")):
            continue
        kw = {k.arg: k.value for k in node.keywords}
        label_node = kw.get("labelnames", kw.get("labels"))
        if label_node is None:
            pos = _LABELS_AT.get(fname, 2)  # Counter .. Enum: (name, documentation, labelnames)
            label_node = node.args[pos] if len(node.args) > pos else None
        labels = set(_const_strings(label_node, consts) or []) if label_node is not None \
            else set()
        if label_node is not None and _const_strings(label_node, consts) is None:
            labels = None
        found[first.value] = Defined(first.value, _CTORS[fname], labels)
    for value in vars(module).values():
        if isinstance(value, CollectorRegistry):
            for fam in value.collect():
                if fam.name.startswith("dhisparse_"):
                    labels = {k for s in fam.samples for k in s.labels} - {"le", "quantile"}
                    found.setdefault(fam.name, Defined(fam.name, fam.type, labels))
    return found


def defined_exposed(defined: dict[str, Defined]) -> dict[str, Defined]:
    """exposed series name -> its definition."""
    return {series: d for d in defined.values() for series in exposed_names(d.name, d.kind)}


# ---------------------------------------------------------------- shared checks


def scrape_targets() -> dict[str, set[tuple[str, int]]]:
    """job -> {(host, port)} from static_configs and dns_sd_configs."""
    out: dict[str, set[tuple[str, int]]] = {}
    for job in prometheus()["scrape_configs"]:
        targets = out.setdefault(job["job_name"], set())
        for sc in job.get("static_configs", []):
            targets |= {host_port(t) for t in sc["targets"]}
        for dns in job.get("dns_sd_configs", []):
            assert dns.get("type", "SRV") == "A", "A records + port for compose DNS"
            targets |= {(n, int(dns["port"])) for n in dns["names"]}
    return out


def assert_env_is_flag(origin: str, var: str, sub: str) -> None:
    if not var.startswith("DHISPARSE_"):
        return
    flag = "--" + var.removeprefix("DHISPARSE_").lower().replace("_", "-")
    assert flag in KNOWN_FLAGS[sub], f"{origin}: {var} is not the env form of a {sub} flag"
