"""FOCUS 1.3 split cost allocation (docs/reports.md, "FOCUS 1.3 split cost allocation"): the
Allocated* columns of an origin charge's rows, their method from the holdings the split took
(`reports.splits`), and AllocatedMethodDetails filled into a template encoded once per line kind,
price-book version and set of holdings."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal

from gpumeter import contract
from gpumeter.billing.models import LineKind
from gpumeter.reports.focus_columns import (
    ALLOCATION_COLUMNS,
    METHOD_PRECEDENCE,
    METHODS,
    TAG_PREFIX,
    WHOLE_GPU_METHOD,
)
from gpumeter.reports.focus_origins import (
    MONEY_UNIT,
    QUANTITY_SCALE,
    TENANT_KINDS,
    Bucket,
    Origin,
    Rates,
    rounded,
)
from gpumeter.reports.model import Holding, Report

# json.dumps with these options makes an encoder on every call (twice a row, ~1 million rows a month)
_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
json_string = json.encoder.encode_basestring  # a JSON string as _ENCODE writes it (ensure_ascii=False)


def json_text(doc: dict) -> str:
    return _ENCODE(doc)


def _one(values: Iterable) -> object:
    """One value where the hours of a row agree, else all of them, sorted; None where none is known."""
    distinct = sorted({v for v in values if v is not None})
    if not distinct:
        return None
    return distinct[0] if len(distinct) == 1 else distinct


def _figure(value: Decimal | None) -> float | None:
    return None if value is None else float(round(value, 6))


def _efficiency(body: dict, mode: str) -> Decimal:
    """The sharing efficiency of a mode in a stored price-version body (PriceVersion.efficiency)."""
    given = body.get("sharing_efficiency", {})
    if mode == contract.SHARING_MPS and mode not in given:
        mode = contract.SHARING_TIME_SLICING
    return Decimal(given.get(mode, "1"))


def _method(holding: Holding, body: dict) -> str:
    replica = holding.replica or holding.mode
    if (
        replica in (contract.SHARING_TIME_SLICING, contract.SHARING_MPS)
        and body.get("sharing_split") == "usage"
        and holding.process_use
    ):
        return "usage"
    return holding.mode


# a holder's tags' keys in json_text's order, each written as JSON with its colon
_CONTAINER, _NAMESPACE, _POD, _TEAM = (
    json_string(f"{TAG_PREFIX}{name}") + ":" for name in ("container", "namespace", "pod", "team")
)


def holder_tags(namespace: str, pod: str, container: str, team: str) -> str:
    """A holder's AllocatedTags: `json_text` of its non-empty names under TAG_PREFIX, written without
    the encoder (a month's FOCUS file names ~70,000 holders at 1,000 GPUs, each once a day; a test
    compares the two)."""
    tags = []
    if container:
        tags.append(_CONTAINER + json_string(container))
    if namespace:
        tags.append(_NAMESPACE + json_string(namespace))
    if pod:
        tags.append(_POD + json_string(pod))
    if team:
        tags.append(_TEAM + json_string(team))
    return "{" + ",".join(tags) + "}"


def _path(first: str, second: str) -> str:
    """The non-empty of two names joined by "/": a holder's resource id and name."""
    return f"{first}/{second}" if first and second else first or second


HOLDERS_KEPT = 50_000  # holders' names and tags (`Allocations._holder`)
_NO_HOLDINGS: frozenset[Holding] = frozenset()
# a slot of an allocation's JSON template: the quoted placeholder the template was encoded with
_SLOT = re.compile('"\ue000([A-Z])\ue001"')


def _slot(name: str) -> str:
    return f"\ue000{name}\ue001"


class Allocations:
    """The FOCUS 1.3 split cost allocation columns of a report's rows (docs/reports.md, "FOCUS 1.3
    split cost allocation"). Every row of an origin charge of more than one row is an allocated
    charge of it: AllocatedRatio its share of the origin's billed cost, the ratios of one origin
    summing to 1; a holder's row names the holder (AllocatedResourceId), a platform line is the
    unallocated portion (no AllocatedResourceId).

    AllocatedMethodDetails is the same document for every row of one kind, price version and set of
    holdings but for a few figures (the ratio, the quantities, the origin's names and cost): it is
    encoded once per such key as a template whose slots the row fills with its figures as JSON."""

    def __init__(self, report: Report, rates: Rates):
        self.report = report
        self.splits = report.splits
        if self.splits is None:
            raise ValueError("FOCUS 1.3 needs the report built with splits=True (reports.model.read_splits)")
        self.rates = rates
        # a GPU is (cluster, uuid): a holder's key names its cluster in its namespace
        # (`cluster/namespace`, billing.models.cluster_namespace; a namespace has no "/")
        merged: dict[tuple[datetime, str, str], set[Holding]] = defaultdict(set)
        for bucket, held in self.splits.items():
            for key, holdings in held.items():
                merged[(bucket, key[2].rpartition("/")[0], key[0])] |= holdings
        # each distinct set kept once: the templates are keyed by it
        kept: dict[frozenset[Holding], frozenset[Holding]] = {}
        self.by_gpu = {key: kept.setdefault(frozen := frozenset(h), frozen) for key, h in merged.items()}
        self._templates: dict[tuple, tuple[str, str, int]] = {}
        self._holders: dict[tuple[str, str, str, str], tuple[str, str, str]] = {}

    def columns(
        self,
        b: Bucket,
        origin: list[Origin],
        part: list[int],
        period_starts: list[str],
        skus: list[str],
        subs: list[str],
    ) -> list[list[str]]:
        """AllocatedMethodDetails, -Id, -ResourceId, -ResourceName and -Tags (ALLOCATION_COLUMNS) of
        bucket ``b``'s rows, as columns: each row's null where it is its origin's only row (nothing was
        split). Per row: ``origin`` and ``part`` (`origins`), ``skus`` and ``subs``, its SkuPriceId and
        SubAccountId, which its x_OriginCharge repeats; ``period_starts``, each row's
        ChargePeriodStart."""
        columns: list[list[str]] = [[] for _ in ALLOCATION_COLUMNS]
        details_of, method_of, resource_of, name_of, tags_of = (c.append for c in columns)
        held_by = self.splits.get(b.bucket, {})  # type: ignore[union-attr]
        for i, (o, kind, version, held, quantity) in enumerate(
            zip(origin, b.kind, b.price_version_id, b.held, b.quantity, strict=True)
        ):
            if o.rows == 1:
                for add in (details_of, method_of, resource_of, name_of, tags_of):
                    add("")
                continue
            tenant = kind in TENANT_KINDS
            if tenant:  # the holder's holdings
                key = (b.uuid[i], b.gpu_instance_id[i], b.namespace[i], b.pod[i], b.container[i])
                holdings = held_by.get(key, _NO_HOLDINGS)
                if not isinstance(holdings, frozenset):  # the templates are keyed by it (`Holdings`: any set)
                    holdings = frozenset(holdings)
            else:  # the holdings of its GPU's split GPU-hours
                holdings = self.by_gpu.get((b.bucket, b.cluster[i], b.uuid[i]), _NO_HOLDINGS)
            template = self._templates.get((kind, version, holdings, bool(held)))
            if template is None:
                template = self._template(kind, version, holdings, bool(held))
            text, method_id, weighted = template
            details_of(
                text.format(
                    R=repr(o.ratio(i)),
                    Q=repr((held if kind == LineKind.TENANT else quantity) / QUANTITY_SCALE),
                    C=o.charge or self._charge(o, b.uuid[i], period_starts[i], skus[i], subs[i]),
                    # x_Weight: the weight the line was priced at, normalisation included: weighted
                    # GPU-hours per instance-hour held (slice-hours / compute slices)
                    W=repr(rounded(quantity * weighted, held, 6)) if weighted and held else "",
                )
            )
            method_of(method_id)
            if tenant:
                resource, name, tags = self._holder(
                    b.namespace[i], b.pod[i], b.container[i], b.team[i], b.cluster[i]
                )
            else:  # the platform's part of the origin charge: the unallocated portion
                resource = name = tags = ""
            resource_of(resource)
            name_of(name)
            tags_of(tags)
        return columns

    def _charge(self, origin: Origin, uuid: str, period_start: str, sku: str, sub_account: str) -> str:
        """x_OriginCharge of an origin's rows, written once for them all (as `json_text` writes it)."""
        origin.charge = (
            f'{{"BilledCost":{json_string(self.report.money(Decimal(origin.billed) * MONEY_UNIT))},'
            f'"ChargePeriodStart":{json_string(period_start)},"ResourceId":{json_string(uuid)},'
            f'"SkuPriceId":{json_string(sku)},"SubAccountId":{json_string(sub_account)}}}'
        )
        return origin.charge

    def _holder(
        self, namespace: str, pod: str, container: str, team: str, cluster: str
    ) -> tuple[str, str, str]:
        """AllocatedResourceId, -ResourceName and -Tags of a holder, kept while a day's pods come
        round again (a month of 10,000 GPUs whose pods change daily has ~1 million: kept all, they
        raised the report's peak from 2,037 to 2,246 MiB)."""
        key = (namespace, pod, container, team)
        named = self._holders.get(key)
        if named is None:
            if len(self._holders) >= HOLDERS_KEPT:
                self._holders.clear()
            namespace = namespace.removeprefix(f"{cluster}/") if cluster else namespace
            name = _path(namespace, pod)
            named = self._holders[key] = (
                _path(name, container),
                name,
                holder_tags(namespace, pod, container, team),
            )
        return named

    def _template(
        self, kind: str, version: int | None, holdings: frozenset[Holding], held: bool
    ) -> tuple[str, str, int]:
        """The details' template of a key, its method's id, and the compute slices the row's x_Weight
        takes (0: none)."""
        tenant = kind in TENANT_KINDS
        body = self.rates.bodies.get(version, {})  # type: ignore[arg-type]
        methods = sorted(
            {_method(h, body) for h in holdings} or {WHOLE_GPU_METHOD}, key=METHOD_PRECEDENCE.index
        )
        if kind == LineKind.IDLE_SHARE:
            methods = [LineKind.IDLE_SHARE.value]
        method = METHODS[methods[0]]
        details: dict[str, object] = {
            "Elements": [
                {
                    "AllocatedRatio": _slot("R"),
                    "UsageUnit": method.usage_unit if tenant else "GPU-Hours",
                    "UsageQuantity": _slot("Q"),
                }
            ],
            "x_OriginCharge": _slot("C"),  # one document for all the origin's rows (`_charge`)
            "x_LineKind": kind,
            "x_PriceBookVersion": self.rates.labels.get(version, ""),  # type: ignore[arg-type]
        }
        if method.policy:
            details["x_Policy"] = body.get(method.policy, "equal" if method.policy == "sharing_split" else "")
        if len(methods) > 1:
            details["x_Methods"] = [METHODS[m].id for m in methods]
        weighted = 0
        if kind == LineKind.TENANT and holdings:
            figures, weighted = _figures(holdings, body)
            if weighted and held:
                figures["x_Weight"] = _slot("W")
            details.update(figures)
        # a slot's placeholder is a JSON string: the row's figure replaces it, quotes and all
        text = _SLOT.sub(r"{\1}", json_text(details).replace("{", "{{").replace("}", "}}"))
        template = (text, method.id, weighted)
        self._templates[(kind, version, holdings, held)] = template
        return template


def _figures(holdings: frozenset[Holding], body: dict) -> tuple[dict[str, object], int]:
    """The parameters the split took: share, efficiency (x_ keys, FOCUS' custom prefix), and the
    compute slices its x_Weight is worked out from (0: no weight)."""
    figures: dict[str, object] = {}
    modes = {h.mode for h in holdings}
    weighted = 0
    if contract.SHARING_MIG in modes:
        slices = _one(h.compute_slices for h in holdings)
        if isinstance(slices, int) and slices:
            weighted = slices
    replicas = [h for h in holdings if (h.replica or h.mode) != contract.SHARING_MIG]
    if replicas:
        figures["x_Share"] = _one(_figure(h.share) for h in replicas)
    grants = [h for h in holdings if h.mode == contract.SHARING_FRACTIONAL]
    if grants:
        figures["x_MemoryShare"] = _one(_figure(h.memory_share) for h in grants if h.memory_share is not None)
        figures["x_ComputeShare"] = _one(
            _figure(h.compute_share) for h in grants if h.compute_share is not None
        )
    efficiency = set()
    for h in holdings:
        e = Decimal(1) if h.mode == contract.SHARING_FRACTIONAL else _efficiency(body, h.mode)
        if h.replica:
            e *= _efficiency(body, h.replica)
            figures["x_Sharing"] = h.replica
        efficiency.add(_figure(e))
    figures["x_SharingEfficiency"] = _one(efficiency)
    return {key: value for key, value in figures.items() if value is not None}, weighted
