"""Columns → facts: each hour's GPU-hours (device, MIG instances, allocations) built from a run's
answers, one cluster at a time where the store holds several (docs/billing.md §2)."""

from __future__ import annotations

import itertools
import logging
from datetime import datetime

from gpumeter import contract
from gpumeter.billing.ingest.carried import LAYOUTS_KEPT, CarriedLayouts, _moved
from gpumeter.billing.ingest.columns import (
    QUERIES,
    SeriesLabels,
    Values,
    _at,
    _in_order,
    _query_columns,
)
from gpumeter.billing.ingest.config import IngestConfig
from gpumeter.billing.ingest.intervals import (
    ASSUMED_INTERVAL,
    HourIntervals,
    mismatch_text,
    seconds_from_count,
)
from gpumeter.billing.ingest.labels import (
    _alloc_key_labels,
    _allocation_labels,
    _allocation_template,
    _at_hour,
    _derived,
    _device_labels,
    _fact,
    _instance_labels,
    _instance_template,
    _keyed,
    _process_key,
    _ratio,
    _uuid_gi,
    _whole,
)
from gpumeter.billing.ledger.base import SHARED_MODES
from gpumeter.billing.ledger.layouts import layout_key
from gpumeter.billing.models import (
    Allocation,
    Device,
    GpuHour,
    MigInstance,
    Readings,
    SteadyGpuHour,
    is_reserved_name,
    memory_room,
    with_fields,
)
from gpumeter.billing.refusals import Refused

log = logging.getLogger(__name__)


class RunAnswers:
    """The answers of every query of §6 for a run of consecutive hours, column-wise.

    A range answer holds each series once with a value per hour, so what joins the series to each
    other (an allocation's share, its instance's utilization, its container's process use) is worked
    out once per series for the whole run, and `build` then makes each hour's facts from the values
    at that hour: the same facts as an instant query per hour would give (tests check it)."""

    @classmethod
    def of(
        cls,
        answers: dict[str, list[tuple[dict[str, str], list]]],
        hours: list[datetime],
        cluster_label: str = contract.CLUSTER_LABEL,
    ) -> RunAnswers | ClusterAnswers:
        """From the answers as Prometheus gives them: (labels, [[unix seconds, value], ...]) per series."""
        first = _at(hours[0]).timestamp()
        refused: Refused = [{} for _ in hours]
        columns = {
            name: _query_columns(name, answers.get(name, ()), first, len(hours), refused, cluster_label)
            for name in QUERIES
        }
        return by_cluster(columns, hours, cluster_label, refused)

    def __init__(
        self,
        col: dict[str, list[tuple[dict, Values]]],
        hours: list[datetime],
        cluster: str = "",
        refused: list[dict[str, str]] | None = None,
    ):
        """``col``: per query name, its series with their values per hour (`_columns`), all of
        ``cluster`` (`by_cluster`); ``refused``: per hour, the uuids of the GPU-hours a refused
        reading leaves out, with why (`screen_values`)."""
        self.hours = hours
        self.cluster = cluster
        self.refused: list[dict[str, str]] = refused if refused is not None else [{} for _ in hours]
        self.series = sum(map(len, col.values()))  # what sizes the next run (`_run_hours`)
        self.devices = [
            (_derived(labels, _device_labels), values) for labels, values in _in_order(col["gpu_count"])
        ]
        self.gpu_util = {key[0]: values for key, values in _keyed(col["gpu_util"], _uuid_gi).items()}
        mig_util = _keyed(col["mig_util"], _uuid_gi)
        self.instances = [
            (found, values, mig_util.get(_derived(labels, _uuid_gi)), _instance_template(found))
            for labels, values in col["mig_count"]
            for found in (_derived(labels, _instance_labels),)
        ]
        # the allocation queries keep exactly the ALLOC_LABELS: match their answers on those values
        shares = _keyed(col["alloc_share"], _alloc_key_labels)
        # fractional grants only (an hour of Prometheus from before them has no such answers)
        memory_shares = _keyed(col["alloc_memory"], _alloc_key_labels)
        compute_shares = _keyed(col["alloc_compute"], _alloc_key_labels)
        process_sm = _keyed(col["proc_sm"], _process_key)
        process_memory = _keyed(col["proc_memory"], _process_key)
        # per hour: the GPUs with any process data, and with SM data (docs/billing.md §3.5)
        self.with_data: list[set[str]] = [set() for _ in hours]
        self.with_sm: list[set[str]] = [set() for _ in hours]
        for processes, into in (
            (process_sm, (self.with_data, self.with_sm)),
            (process_memory, (self.with_data,)),
        ):
            for key, values in processes.items():
                for i, value in enumerate(values):
                    if value is not None:
                        for sets in into:
                            sets[i].add(key[0])
        allocations = []
        for labels, values in col["alloc_count"]:
            found = _derived(labels, _allocation_labels)
            uuid, gi, _, _, namespace, pod, container, *_, key = found
            process_key = (uuid, gi, namespace, pod, container)
            allocations.append(
                (
                    found,
                    values,
                    shares.get(key),
                    memory_shares.get(key),
                    compute_shares.get(key),
                    mig_util.get((uuid, gi)) if gi else self.gpu_util.get(uuid),
                    process_sm.get(process_key),
                    process_memory.get(process_key),
                    _allocation_template(found),
                )
            )
        # each GPU's instances and holders then come out of `build` in the canonical order of its
        # layout (billing/ledger/layouts.py): by (instance, profile) and (instance, namespace, pod,
        # container, resource); sorted once per run, not per GPU-hour
        self.instances.sort(key=lambda s: (s[0][1], s[0][2]))
        allocations.sort(key=lambda s: (s[0][1], s[0][4], s[0][5], s[0][6], s[0][8]))
        # what `build` reads of each, per hour and per series: (values, uuid, hostname, gpu, namespace,
        # pod, whether its GPU is shared, share, memory and compute fractions, utilization, process SM
        # and memory, the fact's template)
        self.allocations = [
            (values, found[0], found[2], found[3], found[4], found[5], found[9] in SHARED_MODES, *rest)
            for found, values, *rest in allocations
        ]
        self.teams: list[dict[str, str]] = [{} for _ in hours]
        # each GPU's layout key of the last hour built, carried to the next (`build`)
        self.layouts = CarriedLayouts()
        # per hour of the run, the GPUs any of whose layout's inputs (device, instance and holder
        # counts, shares, fractions) differ from the hour before: the others keep the key built then
        self.moved: list[set[str]] = _moved(
            len(hours),
            ((found[0], (values,)) for found, values in self.devices),
            ((found[0], (values,)) for found, values, *_ in self.instances),
            ((a[1], (a[0], a[7], a[8], a[9])) for a in self.allocations),
        )
        self._built: tuple | None = None  # (index, config, intervals) of the hour built last
        # per GPU, the hour it was last built in full, which the next hour may be built steady on
        self._templates: dict[str, GpuHour] = {}
        for labels, values in _in_order(col["teams"]):
            namespace, team = labels.get(contract.NAMESPACE), labels.get(contract.LABEL_TEAM)
            if team and is_reserved_name(team):  # it would merge with the reports' own rows
                log.warning("namespace %r: team label %r is a reserved name; ignored", namespace, team)
                continue
            if namespace and team:
                for i, value in enumerate(values):
                    if value is not None:
                        self.teams[i][namespace] = team

    def clusters_by_hour(self) -> list[set[str]]:
        """Per hour of the run, {its cluster} where it has any GPU or allocation sample then, else
        empty: where a global store's cluster went missing (`runs.cluster_gaps`)."""
        absent = set(range(len(self.hours)))
        for values in itertools.chain((v for _, v in self.devices), (a[0] for a in self.allocations)):
            if not absent:  # a steady fleet: the first GPU's series covers every hour
                break
            absent.difference_update([i for i in absent if values[i] is not None])
        return [set() if i in absent else {self.cluster} for i in range(len(self.hours))]

    def refused_at(self, index: int) -> list[tuple[str, str, str]]:
        """The run's ``index``-th hour's refused GPU-hours: (their cluster, uuid, why)."""
        return [(self.cluster, uuid, why) for uuid, why in self.refused[index].items()]

    def build(
        self,
        index: int,
        config: IngestConfig,
        intervals: HourIntervals | None = None,
        problems: list[str] | None = None,
    ) -> tuple[list[GpuHour], dict[str, str]]:
        """The GPU-hours of the run's ``index``-th hour and its kube namespace→team labels (§2).

        ``intervals`` gives each exporter's seconds per sample (default: ``config``'s, else the
        assumed one); ``problems`` collects the series with more samples than the hour holds at
        their interval.
        """
        hour, i = self.hours[index], index
        if intervals is None:
            intervals = HourIntervals({}, config.scrape_interval or ASSUMED_INTERVAL)
        if problems is not None:
            problems.extend(intervals.problems)
        if intervals.mismatched:
            # this cluster's exporters disagree with --scrape-interval: all of its GPU-hours are refused
            # (one not seen steady would be billed at the wrong interval), the other clusters' billed
            why, refused = mismatch_text(intervals.mismatched), self.refused[i]
            for found, values in self.devices:
                if values[i] is not None:
                    refused.setdefault(found[0], why)
            self._built = None  # the next hour is built in full
            return [], dict(self.teams[i])

        by_host, fleet = intervals.by_host, intervals.fleet
        # (count, host) -> (seconds, the interval when the count is more than an hour holds at it,
        # else None): counts repeat, hour after hour and series after series
        counted: dict[tuple[float, str], tuple[int, float | None]] = {}

        troubled: set[str] = set()  # GPUs with a series of more samples than the hour holds

        def seconds(count: float, host: str, uuid: str, what: str, *names: str) -> int:
            held = counted.get((count, host))
            if held is None:
                interval = by_host.get(host, fleet)  # intervals.of(host)
                held = counted[(count, host)] = (
                    seconds_from_count(count, config, interval),
                    interval if count > 3600 / interval + 1 else None,  # one sample of slack at the edges
                )
            if held[1] is not None:
                troubled.add(uuid)
                if problems is not None:
                    problems.append(
                        f"{what % names}: {count:g} samples, more than an hour holds at {held[1]:g} s"
                    )
            return held[0]

        # the hour after the one built last, with the same seconds per sample: a GPU none of whose
        # layout's inputs moved (`_moved`) has the layout of that hour, whose key `kept` holds, and
        # one built in full then or since (its template) is built steady: its readings only
        before = self._built
        moved = (
            self.moved[index]
            if before is not None
            and before[0] == index - 1
            and before[1] is config
            and before[2] == (by_host, fleet)
            else None
        )
        self._built = (index, config, (by_host, fleet))
        kept, one = self.layouts.last, self.layouts.one
        templates = self._templates if moved is not None else {}
        steady: dict[str, Readings] = {}  # the readings of this hour's steady GPUs, as they are read

        devices: dict[str, list] = {}  # uuid -> [samples, best series' samples, its derived labels]
        for found, values in self.devices:
            value = values[i]
            if value is None:
                continue
            entry = devices.get(found[0])
            if entry is None:
                devices[found[0]] = [value, value, found]
                continue
            entry[0] += value  # label changes inside the hour split one GPU over series
            if value > entry[1]:
                entry[1], entry[2] = value, found

        hours: dict[str, GpuHour] = {}
        gpu_util = self.gpu_util
        for uuid, (count, _, (_, model, host, gpu, mig_mode)) in devices.items():
            template = templates.get(uuid)
            if (
                template is not None
                and moved is not None
                and uuid not in moved
                and (key := kept.get(uuid)) is not None
            ):
                # its device series' counts did not move either: the template's device (labels and
                # seconds), with this hour's utilization
                fields = template.device.__dict__.copy()
                fields["utilization"] = _at_hour(gpu_util.get(uuid), i)
                readings = steady[uuid] = ([], [])
                hours[uuid] = SteadyGpuHour(hour, with_fields(Device, fields), template, readings, key)
                continue
            device = _fact(
                Device,
                uuid=uuid,
                model=model,
                present_seconds=seconds(count, host, uuid, "%s", uuid),
                hostname=host,
                gpu=gpu,
                mig_mode=mig_mode,
                utilization=_at_hour(gpu_util.get(uuid), i),
                cluster=self.cluster,
            )
            hours[uuid] = GpuHour(hour, device)

        for (uuid, gi, _, compute, memory), values, utilizations, template in self.instances:
            value = values[i]
            if value is None or uuid not in hours:
                continue  # a layout without its device: nothing to price it against
            if compute is None or memory is None:
                log.warning("MIG instance %s/%s without slice counts; skipped", uuid, gi)
                continue
            utilization = None if utilizations is None else utilizations[i]
            if utilization is not None:
                utilization = _ratio(utilization)
            readings = steady.get(uuid)
            if readings is not None:
                readings[0].append(utilization)
                continue
            owner = hours[uuid]
            fields = template.copy()
            instance = with_fields(MigInstance, fields)
            fields["present_seconds"] = seconds(
                value, owner.device.hostname, uuid, "%s instance %s", uuid, gi
            )
            fields["utilization"] = utilization
            owner.instances.append(instance)

        with_data, with_sm = self.with_data[i], self.with_sm[i]
        for (
            values,
            uuid,
            hostname,
            gpu,
            namespace,
            pod,
            shared,
            shares,
            memory_shares,
            compute_shares,
            utils,
            sm,
            used,
            template,
        ) in self.allocations:
            value = values[i]
            if value is None:
                continue
            utilization = None if utils is None else utils[i]
            if utilization is not None:
                utilization = _ratio(utilization)
            own_sm = own_memory = None
            if uuid in with_data:  # its container's own use: 0 where it ran no process on the GPU (§3.5)
                if uuid in with_sm:
                    reading = None if sm is None else sm[i]
                    own_sm = _ratio(0.0 if reading is None else reading)
                    if shared:  # a shared GPU's holder: its own SM share
                        utilization = own_sm
                reading = None if used is None else used[i]
                own_memory = _whole(0.0 if reading is None else reading)
            readings = steady.get(uuid)
            if readings is not None:
                readings[1].append((utilization, own_sm, own_memory))
                continue
            owner = hours.get(uuid)
            host = hostname or (owner.device.hostname if owner is not None else "")
            held = seconds(value, host, uuid, "%s/%s", namespace, pod)
            if owner is None:  # allocated but the device was never seen: priced as an unknown model
                owner = hours[uuid] = GpuHour(
                    hour, Device(uuid, "", held, hostname, gpu, cluster=self.cluster)
                )
            share = None if shares is None else shares[i]
            memory = None if memory_shares is None else memory_shares[i]
            compute = None if compute_shares is None else compute_shares[i]
            fields = template.copy()
            allocation = with_fields(Allocation, fields)
            fields["allocated_seconds"] = held
            fields["share"] = _ratio(1.0 if share is None else share)
            fields["utilization"] = utilization
            fields["memory_share"] = None if memory is None else _ratio(memory)
            fields["compute_share"] = None if compute is None else _ratio(compute)
            fields["process_sm"] = own_sm
            fields["process_memory"] = own_memory
            owner.allocations.append(allocation)
        refused = self.refused[i]
        built = [hours[u] for u in sorted(hours) if u not in refused]
        carried = {}  # each GPU's template for the next hour: this hour, or the one it was steady on
        for gpu_hour in built:  # in canonical order already: its layout's key, for pricing and the ledger
            uuid = gpu_hour.device.uuid
            if uuid in steady:
                carried[uuid] = templates[uuid]
                continue
            if uuid not in troubled:  # a GPU whose counts made problems is built in full each hour
                carried[uuid] = gpu_hour
            if moved is not None and uuid not in moved and uuid in kept:
                gpu_hour.layout = kept[uuid]
                continue
            key = layout_key(gpu_hour.instances, gpu_hour.allocations)
            if key is not None:  # the key object of the first hour with this layout (`CarriedLayouts`)
                key = one.setdefault(key, key)
            kept[uuid] = gpu_hour.layout = key
        self._templates = carried
        # equal keys then compare value by value again, until met anew. An hour's layouts are at
        # most its GPUs: the bound follows the fleet, or a fleet past it would clear it every hour
        if len(one) > memory_room(LAYOUTS_KEPT, len(built)):
            one.clear()
        return built, dict(self.teams[i])


def by_cluster(
    columns: dict[str, list[tuple[SeriesLabels, Values]]],
    hours: list[datetime],
    cluster_label: str,
    refused: Refused | None = None,
) -> RunAnswers | ClusterAnswers:
    """The run's answers of each cluster apart (`ClusterAnswers`), where the store labels series
    with their cluster; else (one cluster's own Prometheus) the answers as one `RunAnswers`, as before
    clusters. A series without the label in a store with it is the cluster "" (its own)."""
    refused = refused if refused is not None else [{} for _ in hours]
    if not any(cluster_label in labels for series in columns.values() for labels, _ in series):
        return RunAnswers(columns, hours, "", _of_cluster(refused, ""))
    parts: dict[str, dict[str, list]] = {}
    for name, series in columns.items():
        for labels, values in series:
            cluster = labels.get(cluster_label, "")
            kept = SeriesLabels({k: v for k, v in labels.items() if k != cluster_label})
            parts.setdefault(cluster, {n: [] for n in columns})[name].append((kept, values))
    return ClusterAnswers(
        {c: RunAnswers(parts[c], hours, c, _of_cluster(refused, c)) for c in sorted(parts)}, hours
    )


def _of_cluster(refused: Refused, cluster: str) -> list[dict[str, str]]:
    """Per hour, the refused GPU-hours of one cluster: uuid -> why."""
    return [{uuid: why for (c, uuid), why in hour.items() if c == cluster} for hour in refused]


class ClusterAnswers:
    """A run's answers from a store holding several clusters' series: one `RunAnswers` per cluster,
    each built as that cluster's own Prometheus would be (so a cluster bills to the cent as it would
    alone), the GPU-hours of all of them together in (cluster, uuid) order."""

    def __init__(self, parts: dict[str, RunAnswers], hours: list[datetime]):
        self.parts, self.hours = parts, hours
        self.series = sum(part.series for part in parts.values())
        self._layouts = CarriedLayouts()

    @property
    def layouts(self) -> CarriedLayouts:
        return self._layouts

    @layouts.setter
    def layouts(self, layouts: CarriedLayouts) -> None:
        """Each cluster's layout keys carried apart (a UUID may be in two clusters)."""
        self._layouts = layouts
        for cluster, part in self.parts.items():
            part.layouts = layouts.of_cluster(cluster)

    def build(
        self,
        index: int,
        config: IngestConfig,
        intervals: HourIntervals | None = None,
        problems: list[str] | None = None,
    ) -> tuple[list[GpuHour], dict[str, str]]:
        """`RunAnswers.build` of each cluster; the kube namespace→team labels named with their
        cluster (``cluster/namespace``, as a team map names them)."""
        built: list[GpuHour] = []
        teams: dict[str, str] = {}
        for cluster, part in self.parts.items():
            own = None if intervals is None else intervals.of_cluster(cluster)
            gpu_hours, kube_teams = part.build(index, config, own, problems)
            built += gpu_hours
            teams.update((f"{cluster}/{ns}" if cluster else ns, team) for ns, team in kube_teams.items())
        return built, teams

    def clusters_by_hour(self) -> list[set[str]]:
        """Per hour of the run, the clusters with any GPU or allocation sample then."""
        present = {cluster: part.clusters_by_hour() for cluster, part in self.parts.items()}
        return [set().union(*(hours[i] for hours in present.values())) for i in range(len(self.hours))]

    def refused_at(self, index: int) -> list[tuple[str, str, str]]:
        """The run's ``index``-th hour's refused GPU-hours of every cluster: (cluster, uuid, why)."""
        return [r for part in self.parts.values() for r in part.refused_at(index)]
