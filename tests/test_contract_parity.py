"""The metric contract holds where money depends on it (gpumeter/contract/).

Billing's tests consume the history generator's series, never the live exporter's. So the live
exporter (stand-in NVML, stand-in kubelet over gRPC, its real sampler and renderer) and the history
generator are run here on the same fleet at the same instant, and every series billing consumes must
come out of both with the same names, label sets and values. A label renamed in the exporter's catalog
only, not in the contract the history generator and billing's PromQL read, makes that check fail: the
second test renames each label billing reads, one at a time, and shows the check reporting it.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import shutil
import tempfile
from pathlib import Path

import promql_parser
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from gpumeter import contract, third_party
from gpumeter.billing import queries
from gpumeter.billing.ingest import KEEP, QUERIES
from gpumeter.exporter import catalog, render
from gpumeter.exporter.app import build_exporter
from gpumeter.exporter.config import ExporterConfig
from gpumeter.exporter.render import SnapshotCollector
from gpumeter.simulator.device import SimulatedNode
from gpumeter.simulator.fleet import Fleet, load_fleet
from gpumeter.simulator.history import write_history
from gpumeter.simulator.kubeapi import StandInKubeApi
from gpumeter.simulator.kubelet import StandInKubelet
from gpumeter.simulator.nvml import SimulatedNvml
from tests.kubelet.helpers import Clock

# (fleet, node): shared-modes' nodes share replicas two ways (time-slicing, MPS) and hand out
# fractional grants (HAMi, gpushare; read from the stand-in Kubernetes API); its vGPU host has no pods
FLEETS = (
    ("h100-mig", None),
    ("a100-mixed", None),
    ("shared-modes", "gpu-shared-ts-01"),
    ("shared-modes", "gpu-shared-mps-01"),
    ("shared-modes", "gpu-shared-frac-01"),
    ("shared-modes", "gpu-shared-vgpu-01"),  # a vGPU host: its VMs' allocations come from NVML
    # Dynamic Resource Allocation: claims' devices from the kubelet's dynamic_resources, resolved through
    # the stand-in API's ResourceSlices, shared as the claims' config says; and a node mixing both
    ("dra", "gpu-dra-01"),
    ("dra", "gpu-dra-mixed-01"),
)
CLAIM_SHARING = {"TimeSlicing": contract.SHARING_TIME_SLICING, "MPS": contract.SHARING_MPS}
START = 1_790_208_000.0  # the period's start; the fleets' pod schedules count from it
OFFSET = 10 * 3600.0  # 10:00 of day 0: every scheduled pod of both fleets is running
STEP = 600.0  # the history's step; OFFSET is one of its instants
SCRAPE_LABELS = {"job", "instance"}  # added by the scrape, not by either producer
EXPORTED_INPUTS = tuple(s for s in queries.BILLING_INPUTS if s.producer is contract.Producer.EXPORTER)
# Utilization is simulated load plus noise, drawn per 5 s step by the live simulator (±0.05 per pod)
# and per sample by the history (±0.03): both follow the pod schedule, neither repeats the other's
# draws. Every other series billing reads (identity, MIG layout, allocations) must match exactly.
NOISY = {contract.UTILIZATION.name: 0.1, contract.MIG_SM_UTILIZATION.name: 0.1}
# Per-process memory is the device's memory in use (which follows the jittered load) split over its
# processes: within this fraction of the history's, which has no jitter. Per-process SM shares follow
# the pods' utilization without noise in both, so they must match exactly.
NOISY_RELATIVE = {contract.PROCESS_MEMORY_USED.name: 0.25}

Exposition = dict[str, dict[frozenset[tuple[str, str]], float]]  # name → label set → value


def _at_instant(openmetrics: str, at: float) -> str:
    """The history's samples of one instant. The history is written instant by instant, so one
    series' samples are not contiguous as OpenMetrics wants (promtool reads it anyway); one instant
    of it is a valid exposition for the strict parser."""
    stamp = f" {int(at)}"
    lines = [line for line in openmetrics.splitlines() if line.startswith("#") or line.endswith(stamp)]
    return "\n".join(lines) + "\n"


def _collect(families) -> Exposition:
    out: Exposition = {}
    for family in families:
        for sample in family.samples:
            labels = frozenset((k, v) for k, v in sample.labels.items() if k not in SCRAPE_LABELS)
            out.setdefault(sample.name, {})[labels] = sample.value
    return out


def compare(live: Exposition, history: Exposition, inputs=EXPORTED_INPUTS) -> list[str]:
    """Every way the two disagree on the series billing consumes; empty when they agree."""
    problems = []
    for series in inputs:
        name, declared = series.name, set(series.labels)
        mine, theirs = live.get(name, {}), history.get(name, {})
        for source, samples in (("live exporter", mine), ("history", theirs)):
            for labels in {frozenset(k for k, _ in labels) for labels in samples}:
                if labels != declared:
                    problems.append(
                        f"{name}: the {source} labels {sorted(labels)}, the contract {sorted(declared)}"
                    )
        for labels in mine.keys() - theirs.keys():
            problems.append(f"{name}: only the live exporter serves {dict(sorted(labels))}")
        for labels in theirs.keys() - mine.keys():
            problems.append(f"{name}: only the history has {dict(sorted(labels))}")
        tolerance = NOISY.get(name, 0.0)
        relative = NOISY_RELATIVE.get(name, 0.0)
        for labels in mine.keys() & theirs.keys():
            if abs(mine[labels] - theirs[labels]) > max(tolerance, relative * abs(theirs[labels])):
                problems.append(
                    f"{name}{dict(sorted(labels))}: live {mine[labels]}, history {theirs[labels]}"
                )
    return problems


@dataclasses.dataclass
class Sampled:
    fleet: Fleet  # the one node the live exporter simulates
    snapshot: object  # the live exporter's Snapshot at START + OFFSET
    live: Exposition
    history: Exposition


def _render(snapshot) -> str:
    """The snapshot as the exporter's own renderer serves it (native names)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snapshot))
    return generate_latest(registry).decode()


def _one_node(fleet_name: str, node_name: str | None):
    """The fleet with only the node the live exporter simulates (the first unless named)."""
    fleet = load_fleet(fleet_name)
    node = fleet.node(node_name) if node_name else fleet.nodes[0]
    return dataclasses.replace(fleet, nodes=(node,), pods=fleet.pods_on(node.name))


def _live_snapshot(fleet):
    clock = Clock(START)
    node = SimulatedNode(fleet, clock=clock, start=START)
    directory = tempfile.mkdtemp(prefix="gpm-", dir="/tmp")  # sun_path is short: not under tmp_path
    sock = str(Path(directory) / "kubelet.sock")
    kubelet = StandInKubelet(fleet, node.spec.name, sock, clock=clock, start=START).start()
    # fractional grants are on the pods, and the processes' pods are named by the pod list: the
    # exporter lists them from the (stand-in) Kubernetes API
    kube_api = StandInKubeApi(fleet, clock=clock, start=START).start()
    config = ExporterConfig(
        listen="127.0.0.1:0",
        kubelet_socket=sock,
        hostname=node.spec.name,
        interval=5.0,
        kube_api=kube_api.base_url,
        enable_collectors=("processes",),
    )
    exporter = build_exporter(config, clock=clock, library=SimulatedNvml(node), node=node)
    try:
        clock.t = START + OFFSET - 5.0
        exporter.sampler.sample_once()
        clock.t = START + OFFSET  # a second sample: GPM utilization is a difference of two
        return exporter.sampler.sample_once()
    finally:
        exporter.stop()
        kubelet.stop()
        kube_api.stop()
        shutil.rmtree(directory, ignore_errors=True)


@functools.cache
def _sampled(fleet_name: str, node_name: str | None) -> Sampled:
    """Both producers on one node (once per worker: the rename test reads them again)."""
    fleet = _one_node(fleet_name, node_name)
    snapshot = _live_snapshot(fleet)
    out = io.StringIO()
    write_history([fleet], START, START + OFFSET + STEP, STEP, out)
    history = _collect(parse_openmetrics(_at_instant(out.getvalue(), START + OFFSET)))
    return Sampled(fleet, snapshot, _collect(parse_text(_render(snapshot))), history)


@pytest.fixture(params=FLEETS, ids=[node or fleet for fleet, node in FLEETS])
def sampled(request) -> Sampled:
    return _sampled(*request.param)


def test_live_exporter_and_history_agree_on_every_series_billing_consumes(sampled):
    assert compare(sampled.live, sampled.history) == []
    # not vacuous: the fleet's GPUs, MIG instances and pods are there, in both
    fleet = sampled.fleet
    (node,) = fleet.nodes
    gpus = node.gpus
    assert len(sampled.live[contract.GPU_INFO.name]) == len(gpus)
    assert len(sampled.live.get(contract.MIG_INFO.name, {})) == sum(len(gpu.mig) for gpu in gpus)
    held = {
        (p.namespace, p.name, d.gpu, d.gpu_instance_id)
        for p in fleet.pods
        if p.running(OFFSET)
        for d in p.devices
    } | {(v.vm_id, v.uuid, gpu.index, None) for gpu in gpus for v in gpu.vgpus}  # a VM holds its vGPU
    assert len(sampled.live[contract.ALLOCATION.name]) == len(held) > 0
    # how each holding is shared, worked out from the fleet file: replicas by the node's strategy
    replica = contract.SHARING_MPS if node.sharing_strategy == "mps" else contract.SHARING_TIME_SLICING
    sharing = {
        CLAIM_SHARING.get(
            fleet.claim(p.namespace, d.claim).sharing, "exclusive" if d.gpu_instance_id is None else "mig"
        )
        if d.claim is not None
        else "fractional"
        if gpus[d.gpu].fractional
        else replica
        if gpus[d.gpu].time_slicing > 1
        else "exclusive"
        if d.gpu_instance_id is None
        else "mig"
        for p in fleet.pods
        if p.running(OFFSET)
        for d in p.devices
    } | ({contract.SHARING_VGPU} if any(gpu.vgpus for gpu in gpus) else set())
    assert {dict(labels)[contract.SHARING] for labels in sampled.live[contract.ALLOCATION.name]} == sharing
    # a fractional grant carries both fractions, in both producers (compare() checked the values)
    grants = sum(1 for p in fleet.pods if p.running(OFFSET) for d in p.devices if gpus[d.gpu].fractional)
    for series in (contract.ALLOCATION_MEMORY, contract.ALLOCATION_COMPUTE):
        assert len(sampled.live.get(series.name, {})) == grants
    assert contract.UTILIZATION.name in sampled.live or all(gpu.mig_enabled for gpu in gpus)
    has_gpm = any(gpu.model.has_gpm and gpu.mig for gpu in gpus)
    assert (contract.MIG_SM_UTILIZATION.name in sampled.live) == has_gpm
    # every running pod's processes, per container, in both (compare() checked the values)
    pods = {(p.namespace, p.name) for p in fleet.pods if p.running(OFFSET)}
    named = {
        (dict(k)["namespace"], dict(k)["pod"])
        for k in sampled.live.get(contract.PROCESS_MEMORY_USED.name, {})
    }
    assert pods <= named


def _consumed_labels() -> list[tuple[str, str]]:
    """(series, label) for every label billing's PromQL keeps from an exporter series."""
    pairs = {
        (query.series.name, label)
        for query in queries.BILLING_QUERIES.values()
        if query.series.producer is contract.Producer.EXPORTER
        for label in query.by
    }
    return sorted(pairs)


@pytest.mark.parametrize(("name", "label"), _consumed_labels(), ids=lambda x: x)
def test_a_label_renamed_in_the_catalog_only_breaks_parity(monkeypatch, name, label):
    """The exporter renders with a catalog whose ``name`` has ``label`` renamed (the contract, which
    history and billing read, unchanged): the parity check reports exactly that series, on the first
    example node that serves it. A label every series of a scope carries (gpu, uuid, ...) cannot even
    be renamed: the catalog refuses the spec."""
    spec = catalog.by_name(name)
    renamed = tuple(f"{x}_renamed" if x == label else x for x in spec.series.labels)
    series = dataclasses.replace(spec.series, labels=renamed)
    if label in catalog.SCOPE_LABELS[spec.scope]:
        with pytest.raises(ValueError, match=f"{name} labels must start with its scope's"):
            dataclasses.replace(spec, series=series)
        return
    sampled = next((s for s in (_sampled(*f) for f in FLEETS) if name in s.live), None)
    assert sampled is not None, f"no example node serves {name}: the rename cannot be shown"
    changed = tuple(dataclasses.replace(s, series=series) if s is spec else s for s in catalog.CATALOG)
    monkeypatch.setattr(render, "CATALOG", changed)
    live = _collect(parse_text(_render(sampled.snapshot)))

    problems = compare(live, sampled.history)
    assert problems, f"renaming {label} of {name} went unnoticed"
    assert all(p.startswith(name) for p in problems)
    assert any(f"'{label}_renamed'" in p for p in problems)


def _selectors(expr) -> list[str]:
    """Names of the series a parsed PromQL expression selects."""
    if isinstance(expr, promql_parser.VectorSelector):
        return [expr.name]
    if isinstance(expr, promql_parser.MatrixSelector):
        return [expr.vector_selector.name]
    if isinstance(expr, promql_parser.Call):
        return [name for arg in expr.args for name in _selectors(arg)]
    if isinstance(expr, promql_parser.AggregateExpr | promql_parser.ParenExpr):
        return _selectors(expr.expr)
    if isinstance(expr, promql_parser.BinaryExpr):
        return _selectors(expr.lhs) + _selectors(expr.rhs)
    if isinstance(expr, promql_parser.NumberLiteral):  # a value compared with (`HourQuery.left_out`)
        return []
    raise AssertionError(f"{type(expr).__name__} in billing's PromQL: teach this test to read it")


def _groupings(expr) -> list[tuple[list[str], list[str]]]:
    """(labels grouped by, series beneath) for every ``by (...)`` aggregation in the expression."""
    found = []
    if isinstance(expr, promql_parser.AggregateExpr):
        if expr.modifier is not None:
            assert expr.modifier.type == promql_parser.AggModifierType.By, "billing keeps labels with by"
            found.append((list(expr.modifier.labels), _selectors(expr.expr)))
        found += _groupings(expr.expr)
    elif isinstance(expr, promql_parser.Call):
        for arg in expr.args:
            found += _groupings(arg)
    elif isinstance(expr, promql_parser.ParenExpr):
        found += _groupings(expr.expr)
    elif isinstance(expr, promql_parser.BinaryExpr):
        found += _groupings(expr.lhs) + _groupings(expr.rhs)
    return found


@pytest.mark.parametrize("query", sorted(QUERIES), ids=str)
def test_billing_promql_reads_only_contract_series_and_their_labels(query):
    """The PromQL ingest actually sends, parsed: each series it selects is declared in the contract,
    and each label it keeps (the ``max by`` it applies itself, and the engine's equivalent) is one
    that series carries."""
    expr = promql_parser.parse(QUERIES[query])
    names = _selectors(expr)
    assert names
    for name in names:
        contract.series(name)  # KeyError: billing reads a series nobody declared
        missing = set(KEEP[query]) - set(contract.series(name).labels)
        assert not missing, f"{query}: {name} has no label {sorted(missing)}"
    assert not _groupings(expr), f"{query}: sent aggregated; billing reduces by KEEP itself"
    aggregated = promql_parser.parse(queries.BILLING_QUERIES[query].aggregated())
    assert _groupings(aggregated) == [(list(KEEP[query]), names)]


def test_the_contract_declares_each_series_once_and_billing_reads_only_declared_series():
    names = [s.name for s in third_party.EVERY_SERIES]
    assert len(names) == len(set(names))
    assert {s.name for s in contract.EXPORTER_SERIES} == {spec.name for spec in catalog.CATALOG}
    assert set(queries.BILLING_INPUTS) <= set(contract.CONTRACT)
    assert {s.producer for s in queries.BILLING_INPUTS} == {
        contract.Producer.EXPORTER,
        contract.Producer.KUBE_STATE_METRICS,
    }
