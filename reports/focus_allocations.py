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


# a holder's tags in json_text's key order, each key written once as JSON with its colon
_HOLDER_TAGS = tuple(
    (name, json_string(f"{TAG_PREFIX}{name}") + ":")
    for name in sorted(("namespace", "pod", "container", "team"))
)


def holder_tags(namespace: str, pod: str, container: str, team: str) -> str:
    """A holder's AllocatedTags: `json_text` of its non-empty names under TAG_PREFIX, written without
    the encoder (a month's FOCUS file names ~70,000 holders at 1,000 GPUs, each once a day; a test
    compares the two)."""
    values = {"namespace": namespace, "pod": pod, "container": container, "team": team}
    return "{" + ",".join(key + json_string(values[name]) for name, key in _HOLDER_TAGS if values[name]) + "}"


HOLDERS_KEPT = 50_000  # holders' names and tags (`Allocations._holder`)
_NO_HOLDINGS: frozenset[Holding] = frozenset()
UNSPLIT = ("",) * len(ALLOCATION_COLUMNS)
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
        self, b: Bucket, i: int, origin: Origin, part: int, period_start: str, sku: str, sub_account: str
    ) -> tuple[str, ...]:
        """AllocatedMethodDetails, -Id, -ResourceId, -ResourceName and -Tags (ALLOCATION_COLUMNS) of
        row ``i`` of bucket ``b`` (all null where it is its origin's only row: nothing was split);
        ``period_start``: the bucket's ChargePeriodStart as JSON text; ``sku`` and ``sub_account``:
        the row's SkuPriceId and SubAccountId, which its x_OriginCharge repeats."""
        if origin.rows == 1:
            return UNSPLIT
        kind, version, held = b.kind[i], b.price_version_id[i], b.held[i]
        tenant = kind in TENANT_KINDS
        if tenant:  # the holder's holdings
            key = (b.uuid[i], b.gpu_instance_id[i], b.namespace[i], b.pod[i], b.container[i])
            holdings = self.splits.get(b.bucket, {}).get(key, _NO_HOLDINGS)  # type: ignore[union-attr]
            if not isinstance(holdings, frozenset):  # the templates are keyed by it (`Holdings`: any set)
                holdings = frozenset(holdings)
        else:  # the holdings of its GPU's split GPU-hours
            holdings = self.by_gpu.get((b.bucket, b.cluster[i], b.uuid[i]), _NO_HOLDINGS)
        template = self._templates.get((kind, version, holdings, bool(held)))
        if template is None:
            template = self._template(kind, version, holdings, bool(held))
        text, method_id, weighted = template
        quantity = b.quantity[i]
        usage = held if kind == LineKind.TENANT else quantity
        details = text.format(
            R=repr(origin.ratio(b.amount[i], part)),
            Q=repr(usage / QUANTITY_SCALE),
            U=json_string(b.uuid[i]),
            S=period_start,
            B=origin.cost or self._cost(origin),
            K=json_string(sku),
            A=json_string(sub_account),
            W=repr(_weight(quantity, weighted, held)) if weighted and held else "",
        )
        if not tenant:  # the platform's part of the origin charge: the unallocated portion
            return details, method_id, "", "", ""
        return (
            details,
            method_id,
            *self._holder(b.namespace[i], b.pod[i], b.container[i], b.team[i], b.cluster[i]),
        )

    def _cost(self, origin: Origin) -> str:
        origin.cost = json_string(self.report.money(Decimal(origin.billed) * MONEY_UNIT))
        return origin.cost

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
            named = self._holders[key] = (
                "/".join(v for v in (namespace, pod, container) if v),
                "/".join(v for v in (namespace, pod) if v),
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
            "x_OriginCharge": {
                "ResourceId": _slot("U"),
                "ChargePeriodStart": _slot("S"),
                "BilledCost": _slot("B"),
                "SkuPriceId": _slot("K"),
                "SubAccountId": _slot("A"),
            },
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


def _weight(quantity: int, slices: int, held: int) -> float:
    """x_Weight: the weight the line was priced at, normalisation included: weighted GPU-hours per
    instance-hour held (slice-hours / compute slices)."""
    return float(round(Decimal(quantity * slices) / Decimal(held), 6))
