"""``--naming dcgm``: the same snapshot under dcgm-exporter's metric names, labels and units.

A drop-in for NVIDIA/dcgm-exporter 4.8.x (pre-4.9 names and units, docs/dcgm-mode.md §A.2-A.4):

* The metric name is the DCGM field name, e.g. ``DCGM_FI_DEV_GPU_TEMP``; units are dcgm-exporter's
  (MiB, MHz, mJ, %, ns). Which native metric feeds which field, and the scale, is declared in the
  catalog (``MetricSpec.dcgm``); this module only applies it. Fields NVML cannot provide (the DCP
  profiling fields before Hopper, NVLink bandwidth totals, vGPU license) are absent, never 0
  (docs/dcgm-mode.md).
* Every GPU series carries ``gpu``, ``UUID``, ``pci_bus_id``, ``device`` (``nvidia<minor>``),
  ``modelName``, ``hostname`` and the ``DCGM_FI_DRIVER_VERSION`` label row of default-counters.csv.
* MIG: a MIG-enabled GPU appears as its GPU instances, as in dcgm-exporter: per-instance fields
  (``FB_*``, ``PROF_*``) carry the instance's value, device fields (temperature, power, clocks ...) the
  parent's, repeated on each instance with ``GPU_I_PROFILE``, ``GPU_I_ID`` and the instance's pods
  (#317), so pod queries written for dcgm-exporter work. Native names keep one series per GPU.
* Pods: ``pod``, ``namespace`` and ``container`` from ``nvidia_gpu_allocation`` of the same snapshot,
  whole GPUs matched by UUID, MIG instances by (GPU index, GPU instance id) (#272, #577). A device
  that several pods share (time-slicing) gets one series per pod, at most ``MAX_PODS_PER_DEVICE``,
  where dcgm-exporter labels only the last one (#307). Each of those series carries the device's
  value: do not sum them across pods. A pod holding the device through a DRA claim also carries
  dcgm-exporter's ``dra_claim_name``, ``dra_claim_namespace``, ``dra_driver_name``, ``dra_pool_name``,
  ``dra_device_name`` and, on a MIG device, ``dra_mig_profile`` and ``dra_mig_device_uuid`` (4.4.0, #535).
* ``DCGM_FI_DEV_XID_ERRORS`` is the code of the last XID (the newest timestamp), 0 when none, with
  ``err_code`` and ``err_msg`` labels, as dcgm-exporter reports it (quirk §2.4). Native mode counts
  every XID.
* Per-link NVLink error fields ``…_L0`` … ``…_L17`` and their per-GPU ``…_TOTAL``.
* ``-f FILE`` (``DcgmOptions``) exports exactly the fields a dcgm-exporter CSV lists.
* Counters keep dcgm-exporter's names (no ``_total`` suffix) and their ``counter`` type.
* The exporter's own ``gpumeter_exporter_*`` series keep their native names.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .catalog import CATALOG, DEPRECATED_DCGM_FIELDS, DcgmField, MetricSpec, MetricType, Scope, by_name
from .snapshot import DeviceIdentity, Snapshot
from .xid_messages import message as xid_message

__all__ = [
    "DEVICE_LABELS",
    "DRIVER_LABEL",
    "FIELDS",
    "HOSTNAME_LABEL",
    "MAX_PODS_PER_DEVICE",
    "MIG_LABELS",
    "POD_LABELS",
    "DcgmOptions",
    "collect_dcgm",
    "describe_dcgm",
    "options_from_collectors",
]

log = logging.getLogger(__name__)

# dcgm-exporter's GPU labels (§3). ``Hostname`` is the spelling of the releases most dashboards and
# alert rules in use were written for (up to 4.8.2); 4.8.3 renamed it ``hostname`` (#655).
DEVICE_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName")
MIG_LABELS = ("GPU_I_PROFILE", "GPU_I_ID")
HOSTNAME_LABEL = "Hostname"
HOSTNAME_LABELS = ("Hostname", "hostname")  # --dcgm-hostname-label
DRIVER_LABEL = "DCGM_FI_DRIVER_VERSION"  # the `label` row of default-counters.csv
POD_LABELS = ("pod", "namespace", "container")
XID_CODE_LABEL = "err_code"
XID_TEXT_LABEL = "err_msg"
MAX_PODS_PER_DEVICE = 16  # bound on the series a time-sliced device fans out to
DECIMALS = 6  # dcgm-exporter prints doubles with %f

_INFO = by_name("nvidia_gpu_info")
_ALLOCATION = by_name("nvidia_gpu_allocation")
_DRA_INFO = by_name("nvidia_gpu_allocation_dra_info")
_XID_COLLECTOR = "xid"
_warned: set[tuple[str, str]] = set()


class _CounterType(str):
    """The type string "counter" that prometheus-client's text encoder does not recognise as one.

    dcgm-exporter exposes counters under their bare field names (``# TYPE
    DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter`` with samples of that name); prometheus-client would
    append ``_total`` to a counter's name, which breaks every query written for dcgm-exporter. This
    string prints as ``counter`` but compares unequal to it, so the encoders write the type line and
    the samples unchanged. tests/exporter/test_dcgm.py pins the rendered lines in both formats.
    """

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    __hash__ = str.__hash__


_COUNTER = _CounterType("counter")


@dataclass(frozen=True, slots=True)
class Source:
    """One native metric feeding a DCGM field."""

    spec: MetricSpec
    field: DcgmField
    match: tuple[tuple[int, str], ...]  # (label position, required value)
    latest: int | None  # label position of ``field.latest_label``


@dataclass(frozen=True, slots=True)
class DcgmMetric:
    name: str
    type: MetricType
    help: str
    sources: tuple[Source, ...]

    @property
    def latest(self) -> bool:
        """A last-event field (the newest XID): absent until the first cycle that collects it."""
        return any(s.latest is not None for s in self.sources)

    @property
    def per_mig_instance(self) -> bool:
        """Reported per GPU instance on a MIG-enabled GPU (a MIG metric provides it)."""
        return any(s.spec.scope is Scope.MIG for s in self.sources)


@dataclass(frozen=True, slots=True)
class DcgmOptions:
    """What ``-f/--collectors FILE`` and ``--dcgm-hostname-label`` change about dcgm naming.

    ``fields`` None exports every field the catalog maps (the default); otherwise exactly these, each
    with the type and help text its CSV row gives (dcgm-exporter prints the row's). ``driver_label``
    is the ``DCGM_FI_DRIVER_VERSION`` label row: on by default, and with a file only if it lists it.
    """

    fields: frozenset[str] | None = None  # None: DEFAULT_FIELDS
    types: tuple[tuple[str, str], ...] = ()  # field -> "gauge" / "counter" from the CSV
    helps: tuple[tuple[str, str], ...] = ()
    hostname_label: str = HOSTNAME_LABEL
    driver_label: bool = True

    def __post_init__(self) -> None:
        if self.hostname_label not in HOSTNAME_LABELS:
            raise ValueError(
                f"dcgm_hostname_label: must be {' or '.join(HOSTNAME_LABELS)} (got {self.hostname_label!r:.40})"
            )


DEFAULT_OPTIONS = DcgmOptions()


def options_from_collectors(collectors, hostname_label: str = HOSTNAME_LABEL) -> DcgmOptions:
    """Options for a parsed collectors file (``exporter.dcgm_csv.CollectorsFile``); the fields it lists
    that this exporter cannot export are named in one warning (dcgm-exporter skips them too)."""
    if collectors is None:
        return DcgmOptions(hostname_label=hostname_label)
    missing = collectors.unexported(frozenset(FIELDS), frozenset({DRIVER_LABEL}))
    if missing:
        log.warning(
            "%s: %d listed field(s) not exported, NVML cannot answer them or they are not DCGM fields "
            "(docs/dcgm-mode.md): %s",
            collectors.path,
            len(missing),
            ", ".join(missing),
        )
    rows = [f for f in collectors.fields if f.name in FIELDS and f.type != "label"]
    return DcgmOptions(
        fields=frozenset(f.name for f in rows),
        types=tuple((f.name, f.type) for f in rows if f.type in ("gauge", "counter")),
        helps=tuple((f.name, f.help) for f in rows if f.help),
        hostname_label=hostname_label,
        driver_label=DRIVER_LABEL in collectors.labels,
    )


def _build_fields() -> dict[str, DcgmMetric]:
    grouped: dict[str, list[Source]] = {}
    for spec in CATALOG:
        if spec.scope not in (Scope.DEVICE, Scope.MIG):
            continue
        names = spec.label_names
        for field in spec.dcgm:
            match = tuple((names.index(label), value) for label, value in field.match)
            latest = names.index(field.latest_label) if field.latest_label else None
            grouped.setdefault(field.name, []).append(Source(spec, field, match, latest))
    out = {}
    for name, sources in grouped.items():
        types = {s.spec.type for s in sources}
        scopes = [s.spec.scope for s in sources]
        if len(types) != 1 or len(scopes) != len(set(scopes)):
            raise ValueError(f"catalog: {name} must come from one device and/or one MIG metric of one type")
        out[name] = DcgmMetric(
            name, types.pop(), sources[0].field.help or sources[0].spec.help, tuple(sources)
        )
    return out


FIELDS: dict[str, DcgmMetric] = _build_fields()
# Without -f: every field except the per-link NVLink ones (_L0 ... _L17), which dcgm-exporter's own CSVs
# leave out too; on a MIG node they would be 4 x 18 links x every GPU instance (4,032 series on 8xH100
# 1g.10gb). A collectors file that lists them gets them (seed 003's lists _L0); the _TOTALs are in.
DEFAULT_FIELDS = frozenset(
    name for name in FIELDS if not re.fullmatch(r".+_L\d+", name) and name not in DEPRECATED_DCGM_FIELDS
)
_NATIVE = tuple(spec for spec in CATALOG if spec.scope is Scope.EXPORTER)


def _dcgm_family(metric: DcgmMetric, options: DcgmOptions = DEFAULT_OPTIONS) -> Metric:
    help_text = dict(options.helps).get(metric.name, metric.help)
    kind = dict(options.types).get(metric.name, "counter" if metric.type is MetricType.COUNTER else "gauge")
    family = Metric(metric.name, help_text, "gauge")
    if kind == "counter":
        family.type = _COUNTER
    return family


def _selected(options: DcgmOptions) -> Iterator[DcgmMetric]:
    wanted = DEFAULT_FIELDS if options.fields is None else options.fields
    for metric in FIELDS.values():
        if metric.name in wanted:
            yield metric


def _native_family(spec: MetricSpec) -> Metric:
    if spec.type is MetricType.COUNTER:
        return CounterMetricFamily(spec.family_name, spec.help, labels=list(spec.label_names))
    return GaugeMetricFamily(spec.name, spec.help, labels=list(spec.label_names))


def describe_dcgm(options: DcgmOptions = DEFAULT_OPTIONS) -> Iterator[Metric]:
    for metric in _selected(options):
        yield _dcgm_family(metric, options)
    for spec in _NATIVE:
        yield _native_family(spec)


class _View:
    """What one snapshot says about devices and pods, indexed for rendering."""

    def __init__(self, snapshot: Snapshot, options: DcgmOptions = DEFAULT_OPTIONS):
        self.snapshot = snapshot
        self.options = options
        self.devices = {d.uuid: d for d in snapshot.devices}
        driver_at = _INFO.label_names.index("driver_version")
        drivers = {labels[1]: labels[driver_at] for labels, _ in snapshot.samples(_INFO.name)}
        self.base = {
            d.uuid: {
                "gpu": str(d.index),
                "UUID": d.uuid,
                "pci_bus_id": d.pci_bus_id,
                "device": f"nvidia{d.index if d.minor_number is None else d.minor_number}",
                "modelName": d.model,
                options.hostname_label: snapshot.hostname,
                **({DRIVER_LABEL: drivers.get(d.uuid, "")} if options.driver_label else {}),
            }
            for d in snapshot.devices
        }
        self.holders = self._holders(snapshot)
        self.indexes: dict[tuple, dict[tuple[str, ...], list]] = {}
        self._targets: dict[str, tuple[tuple[dict[str, str], tuple[dict[str, str], ...]], ...]] = {}

    def targets(self, device: DeviceIdentity):
        """Where a device field's value goes: the GPU itself, or on a MIG-enabled GPU each of its GPU
        instances, with ``GPU_I_PROFILE``, ``GPU_I_ID`` and that instance's pods, as dcgm-exporter
        reports a MIG GPU (as its GPU instances, device fields repeated on each: §4, #317)."""
        found = self._targets.get(device.uuid)
        if found is None:
            base = self.base[device.uuid]
            if device.mig_enabled and device.migs:
                instances: dict[int, str] = {}
                for mig in device.migs:
                    instances.setdefault(mig.gpu_instance_id, mig.profile)
                found = tuple(
                    (
                        {**base, "GPU_I_PROFILE": profile, "GPU_I_ID": str(gi)},
                        self.holders.get((str(device.index), str(gi)), ()),
                    )
                    for gi, profile in sorted(instances.items())
                )
            else:
                found = ((base, self.holders.get((device.uuid, ""), ())),)
            self._targets[device.uuid] = found
        return found

    @staticmethod
    def _dra_labels(snapshot: Snapshot) -> dict[tuple[str, ...], dict[str, str]]:
        """dcgm-exporter's DRA labels (internal/pkg/transformation/dra.go, 4.4.0+) of each DRA holder, by
        (namespace, pod, container, uuid, gpu_instance_id) of its allocation."""
        names = _DRA_INFO.label_names
        migs = {(str(m.gpu_index), str(m.gpu_instance_id)): m for d in snapshot.devices for m in d.migs}
        out = {}
        for labels, _ in snapshot.samples(_DRA_INFO.name):
            row = dict(zip(names, labels, strict=True))
            found = {
                "dra_claim_name": row["claim_name"],
                "dra_claim_namespace": row["claim_namespace"],
                "dra_driver_name": row["driver"],
                "dra_pool_name": row["pool"],
                "dra_device_name": row["device"],
            }
            mig = migs.get((row["gpu"], row["gpu_instance_id"])) if row["gpu_instance_id"] else None
            if mig is not None:
                found |= {"dra_mig_profile": mig.profile, "dra_mig_device_uuid": mig.uuid}
            key = (row["namespace"], row["pod"], row["container"], row["uuid"], row["gpu_instance_id"])
            out[key] = found
        return out

    @classmethod
    def _holders(cls, snapshot: Snapshot) -> dict[tuple[str, str], tuple[dict[str, str], ...]]:
        """(parent uuid, "") for whole GPUs, (gpu index, gpu instance id) for MIG -> pod labels (and a
        DRA holder's dra_* labels)."""
        names = _ALLOCATION.label_names
        at = {label: names.index(label) for label in (*POD_LABELS, "uuid", "gpu", "gpu_instance_id")}
        dra = cls._dra_labels(snapshot)
        found: dict[tuple[str, str], set[tuple[str, ...]]] = {}
        extra: dict[tuple[str, ...], dict[str, str]] = {}
        for labels, _share in snapshot.samples(_ALLOCATION.name):
            gi = labels[at["gpu_instance_id"]]
            key = (labels[at["uuid"]], "") if gi == "" else (labels[at["gpu"]], gi)
            pod = tuple(labels[at[label]] for label in POD_LABELS)
            found.setdefault(key, set()).add(pod)
            held = dra.get((pod[1], pod[0], pod[2], labels[at["uuid"]], gi))
            if held is not None:
                extra[pod] = held
        out = {}
        for key, pods in found.items():
            ordered = sorted(pods, key=lambda p: (p[1], p[0], p[2]))  # namespace, pod, container
            if len(ordered) > MAX_PODS_PER_DEVICE:
                if key not in _warned and len(_warned) < 1024:  # once per device, bounded
                    _warned.add(key)
                    log.warning(
                        "%d pods share device %s; dcgm naming labels the first %d only "
                        "(every holder is in native nvidia_gpu_allocation)",
                        len(ordered),
                        "/".join(key),
                        MAX_PODS_PER_DEVICE,
                    )
                ordered = ordered[:MAX_PODS_PER_DEVICE]
            out[key] = tuple(
                {**dict(zip(POD_LABELS, pod, strict=True)), **extra.get(pod, {})} for pod in ordered
            )
        return out

    def device(self, uuid: str) -> DeviceIdentity | None:
        device = self.devices.get(uuid)
        return device if device is not None and device.up else None


def _value(value: float, scale: float, integer: bool = False) -> float:
    if integer:  # DCGM's int64 fields: truncated as its integer division of bytes into MiB truncates
        return float(math.floor(value * scale + 1e-9))  # (the epsilon keeps 0.29 x 100 at 29)
    return round(value * scale, DECIMALS)


def _add(family: Metric, labels: dict[str, str], holders: tuple[dict[str, str], ...], value: float) -> None:
    if not holders:
        family.add_sample(family.name, labels, value)
    for pod in holders:
        family.add_sample(family.name, {**labels, **pod}, value)


def _matching(view: _View, source: Source) -> tuple:
    """The samples of the source's native metric that its ``match`` picks, from an index built once
    per snapshot and label positions: a field per NVLink link would otherwise rescan every sample."""
    if not source.match:
        return view.snapshot.samples(source.spec.name)
    positions = tuple(i for i, _ in source.match)
    key = (source.spec.name, positions)
    index = view.indexes.get(key)
    if index is None:
        index = {}
        for sample in view.snapshot.samples(source.spec.name):
            index.setdefault(tuple(sample[0][i] for i in positions), []).append(sample)
        view.indexes[key] = index
    return tuple(index.get(tuple(wanted for _, wanted in source.match), ()))


def _render(metric: DcgmMetric, view: _View) -> Metric:
    family = _dcgm_family(metric, view.options)
    per_instance = metric.per_mig_instance
    for source in metric.sources:
        samples = _matching(view, source)
        if source.spec.scope is Scope.MIG:
            seen: set[tuple[str, str]] = set()
            for labels, value in samples:
                gpu, uuid, gi, _ci, profile = labels[:5]
                device = view.device(uuid)
                if device is None or (uuid, gi) in seen:
                    continue  # compute instances are never shown apart (§4)
                seen.add((uuid, gi))
                if gi == "":  # a whole GPU's series of a per-GPU-or-instance metric (GPM profiling)
                    holders = view.holders.get((uuid, ""), ())
                    _add(
                        family,
                        view.base[uuid],
                        holders,
                        _value(value, source.field.scale, source.field.integer),
                    )
                    continue
                base = {**view.base[uuid], "GPU_I_PROFILE": profile, "GPU_I_ID": gi}
                _add(
                    family,
                    base,
                    view.holders.get((gpu, gi), ()),
                    _value(value, source.field.scale, source.field.integer),
                )
        elif source.latest is not None:
            _render_latest(family, source, samples, view)
        elif source.field.total:
            totals: dict[str, float] = {}
            bits = dict(source.field.bits)
            bit_at = source.spec.label_names.index(source.field.bits_label) if bits else -1
            for labels, value in samples:
                if bits:  # a bitmask: each 0/1 series counts as its bit
                    value = value * bits.get(labels[bit_at], 0)
                totals[labels[1]] = totals.get(labels[1], 0.0) + value
            for uuid, total in totals.items():
                device = view.device(uuid)
                if device is not None:
                    for labels, holders in view.targets(device):
                        _add(family, labels, holders, _value(total, source.field.scale, source.field.integer))
        else:
            for labels, value in samples:
                device = view.device(labels[1])
                if device is None or (per_instance and device.mig_enabled):
                    continue
                scaled = _value(value, source.field.scale, source.field.integer)
                for target, holders in view.targets(device):
                    _add(family, target, holders, scaled)
    return family


def _render_latest(family: Metric, source: Source, samples, view: _View) -> None:
    """The label value of each device's series with the highest value (the newest XID), 0 if none,
    with dcgm-exporter's ``err_code`` and ``err_msg`` (NVIDIA's XID catalog text) labels."""
    newest: dict[str, tuple[float, float]] = {}
    for labels, value in samples:
        try:
            code = float(labels[source.latest])
        except ValueError:
            continue
        best = newest.get(labels[1])
        if best is None or (value, code) > best:
            newest[labels[1]] = (value, code)
    collected = any(c.name == _XID_COLLECTOR for c in view.snapshot.collectors)
    for device in view.snapshot.devices:
        if not device.up or not view.snapshot.nvml_up:
            continue
        if device.uuid in newest:
            code = newest[device.uuid][1]
        elif collected:
            code = 0.0
        else:
            continue
        error = {XID_CODE_LABEL: f"{code:g}", XID_TEXT_LABEL: xid_message(int(code))}
        for labels, holders in view.targets(device):
            _add(family, {**labels, **error}, holders, _value(code, source.field.scale, source.field.integer))


# Fields a collectors file asks for that some GPU of this node did not serve, logged once per field.
_unserved: set[str] = set()


def _who_can(metric: DcgmMetric) -> str:
    """Which source can serve a field NVML does not serve on a GPU."""
    if metric.name.startswith("DCGM_FI_PROF_"):
        return (
            "NVML measures it with GPM on Hopper and later only; DCGM's profiling module does on Volta and "
            "later: run dcgm-exporter beside gpumeter for it (docs/dcgm-mode.md §6)"
        )
    sources = "; ".join(dict.fromkeys(s.spec.nvml for s in metric.sources))
    return (
        f"gpumeter reads it from {sources}, which NVML does not answer there (in MIG mode, on this model "
        "or driver); dcgm-exporter reads it through NVML too"
    )


def _log_unserved(metric: DcgmMetric, family: Metric, snapshot: Snapshot) -> None:
    """Once per field: the GPUs of this node a listed field has no sample for, and which source can serve
    it, so that a field of the collectors file is never silently absent (dcgm-exporter logs it too)."""
    if metric.name in _unserved or not snapshot.nvml_up:
        return
    served = {sample.labels.get("UUID") for sample in family.samples}
    missing = [d for d in snapshot.devices if d.up and d.uuid not in served]
    if not missing:
        return
    _unserved.add(metric.name)
    by_model: dict[str, list[str]] = {}
    for device in missing:
        by_model.setdefault(device.model, []).append(str(device.index))
    log.warning(
        "%s, listed in the collectors file, is not served on %d of %d GPUs (%s): %s",
        metric.name,
        len(missing),
        len(snapshot.devices),
        "; ".join(f"{model} GPU {', '.join(indexes)}" for model, indexes in sorted(by_model.items())),
        _who_can(metric),
    )


def collect_dcgm(snapshot: Snapshot, options: DcgmOptions = DEFAULT_OPTIONS) -> Iterator[Metric]:
    view = _View(snapshot, options)
    for metric in _selected(options):
        family = _render(metric, view)
        if options.fields is not None and not metric.latest:
            _log_unserved(metric, family, snapshot)
        if family.samples:  # unsupported or absent: no family, never NaN or 0
            yield family
    for spec in _NATIVE:
        samples = snapshot.samples(spec.name)
        if not samples:
            continue
        family = _native_family(spec)
        for labels, value in samples:
            family.add_metric(labels, value)
        yield family
