"""FOCUS 1.3 (default), 1.4 and 1.2 cost-and-usage rows from a report.

Mapping (docs/reports.md, "FOCUS mapping"): one row per charge line of the ledger, summed over the
report's grain (a UTC day by default, an hour with ``--grain hour``), ``x_``-prefixed custom columns
after the FOCUS columns. The rows are grouped into origin charges — one GPU's charge for one bucket
under one price-book version — and every row of one carries the origin's dimensions, its summable
metrics adding up to the origin's ("FOCUS origin charges"). 1.3 and 1.4 add split cost allocation:
every row of an origin of more than one row is an allocated charge of it, its method in
``AllocatedMethodId`` (the catalog ``METHODS``) and its figures in ``AllocatedMethodDetails``. The
columns are in `reports.focus_columns`, the schema check in `reports.focus_check`.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from gpumeter.billing.ledger.types import MONEY_PLACES, QUANTITY_PLACES
from gpumeter.billing.models import LineKind
from gpumeter.reports import csvfile
from gpumeter.reports.focus_allocations import Allocations, json_text
from gpumeter.reports.focus_check import check_csv as check_csv
from gpumeter.reports.focus_check import check_file as check_file
from gpumeter.reports.focus_columns import (
    ALLOCATION_COLUMNS,
    COLUMN_SPEC,
    FOCUS_VERSION,
    HEADERS,
    TAG_PREFIX,
    VERSIONS,
)
from gpumeter.reports.focus_columns import COLUMNS as COLUMNS
from gpumeter.reports.focus_columns import METHODS as METHODS
from gpumeter.reports.focus_origins import (
    TENANT_KINDS,
    Bucket,
    Origin,
    Rates,
    bucket_bounds,
    buckets,
    mean_text,
    num,
    origins,
    scaled,
    sub_account,
)
from gpumeter.reports.model import Report
from gpumeter.reports.period import utc_text


@lru_cache(maxsize=4096)
def _origin_tags(model: str, cluster: str) -> str:
    """The origin's own tags: every row of it carries them; the holder's are AllocatedTags (1.3)."""
    tags = {"gpu_model": model, "pool": model}
    if cluster:
        tags["cluster"] = cluster
    return json_text({f"{TAG_PREFIX}{k}": v for k, v in tags.items()})


# columns whose cells gpumeter writes from figures, times, JSON documents or its own allowed values:
# none starts with a formula character but a plain number (a negative amount), which stays a number
_NEVER_FORMULAS = frozenset(
    name
    for name, (_, kind) in COLUMN_SPEC.items()
    if kind in ("decimal", "datetime", "json", "allocation") or isinstance(kind, (set, frozenset))
)


# columns of figures and times gpumeter writes itself (`scaled`, `num`, `utc_text`): never quoted or defused
_WRITTEN = frozenset(name for name, (_, kind) in COLUMN_SPEC.items() if kind in ("decimal", "datetime"))


def rows(report: Report, **options: Any) -> list[dict]:
    """The FOCUS rows of a report, all at once, each a dict by column (`iter_rows`, whose options it
    takes)."""
    header = HEADERS[options.get("version", FOCUS_VERSION)]
    return [dict(zip(header, row, strict=True)) for row in iter_rows(report, **options)]


def iter_rows(report: Report, **options: Any) -> Iterator[tuple[str, ...]]:
    """The FOCUS rows of a report, each in the column order of its version (`HEADERS`), in the
    report's charge order (deterministic): every row of one origin charge carries the origin's
    dimensions; who or what a row charges is in the Allocated* (1.3, 1.4) and x_ columns only. The
    options are `iter_columns`'."""
    for columns in iter_columns(report, **options):
        yield from zip(*columns, strict=True)


def iter_columns(
    report: Report,
    *,
    account: str = "gpumeter",
    service: str = "Kubernetes GPU",
    version: str = FOCUS_VERSION,
    keep_formulas: bool = True,
) -> Iterator[list[list[str]]]:
    """`iter_rows`' rows a bucket of charges at a time, as the bucket's columns in the order of
    ``version``: what is held is one bucket's columns, and the CSV is written from them as they are.
    Text cells that a spreadsheet would read as formulas are made inert (`csvfile.neutralise_column`)
    unless ``keep_formulas``."""
    if version not in VERSIONS:
        raise ValueError(f"focus version: expected one of {', '.join(VERSIONS)} (value {version!r})")
    rates = Rates(report)
    allocations = Allocations(report, rates) if version != "1.2" else None
    header = HEADERS[version]
    alike = _alike(report, account, service, keep_formulas)
    for b in buckets(report.charges):
        columns = _bucket_columns(report, b, rates, allocations)
        if not keep_formulas:
            for name in columns.keys() - _NEVER_FORMULAS:
                columns[name] = csvfile.neutralise_column(columns[name])
        n = len(b.kind)
        yield [columns[name] if name in columns else [alike[name]] * n for name in header]


def _alike(report: Report, account: str, service: str, keep_formulas: bool) -> dict[str, str]:
    """What every row of the report states alike, by column (defused unless ``keep_formulas``)."""
    period = report.period
    alike = {
        "BillingAccountId": account,
        "BillingAccountName": account,
        "BillingPeriodEnd": utc_text(period.end),
        "BillingPeriodStart": utc_text(period.start),
        "ChargeCategory": "Usage",
        "ChargeClass": "",
        "ChargeFrequency": "Usage-Based",
        "ConsumedUnit": "GPU-Hours",
        "InvoiceId": f"{account}-{period.label}",
        "InvoiceIssuerName": account,
        "PricingUnit": "GPU-Hours",
        "ProviderName": account,
        "PublisherName": account,
        "ResourceType": "GPU",
        "ServiceCategory": "Compute",
        "ServiceName": service,
        "ServiceSubcategory": "Containers",
        "ContractApplied": "",
        "HostProviderName": account,
        "ServiceProviderName": account,
    }
    if not keep_formulas:
        alike = {name: csvfile.neutralise(value) for name, value in alike.items()}
    return alike


def _bucket_columns(
    report: Report, b: Bucket, rates: Rates, allocations: Allocations | None
) -> dict[str, list[str]]:
    """The columns of one bucket's rows that are not the same for every row of the report."""
    n = len(b.kind)
    labels = rates.labels
    origin, part = origins(report, b, rates)
    start, end = bucket_bounds(report, b.bucket)
    bucket_period = (utc_text(start), utc_text(end))
    periods: dict[tuple, tuple[str, str]] = {}

    def charge_period(o: Origin) -> tuple[str, str]:
        # where two price versions split a GPU's bucket, each origin's period is the hours its version
        # priced, so that the two origin charges are told apart by their columns (and their periods add
        # up to the bucket); else the bucket's
        if o.span is None:
            return bucket_period
        period = periods.get(o.span)
        if period is None:
            first, last = o.span
            period = periods[o.span] = (
                utc_text(max(start, first)),
                utc_text(end if last is None else min(end, last)),
            )
        return period

    charge_periods = [charge_period(o) for o in origin]
    charge_starts = [p[0] for p in charge_periods]
    unpriced = [o.unpriced for o in origin]
    mig = [bool(gi) for gi in b.gpu_instance_id]
    descriptions: dict[tuple, str] = {}
    subs = {key: sub_account(*key) for key in set(zip(b.cluster, b.model, strict=True))}
    gpus = report.gpus or {}
    names: dict[tuple[str, str, str], str] = {}

    def description(i: int) -> str:
        key = (unpriced[i], b.price_version_id[i], b.model[i])
        text = descriptions.get(key)
        if text is None:
            text = descriptions[key] = _description(*key, labels)
        return text

    def resource_name(cluster: str, uuid: str, model: str) -> str:
        # a name a person reads: the node and the GPU's index on it, and the model; null unknown
        name = names.get((cluster, uuid, model))
        if name is None:
            gpu = gpus.get((b.bucket, cluster, uuid))
            name = f"{gpu.hostname} GPU {gpu.index} ({model})" if gpu and gpu.hostname else ""
            names[(cluster, uuid, model)] = name
        return name

    billed = [scaled(a or 0, MONEY_PLACES) for a in b.amount]
    consumed = [scaled(p, QUANTITY_PLACES) for p in part]
    listed = [o.list_cost(p) for o, p in zip(origin, part, strict=True)]
    # an unpriced row's list cost is 0 (`Origin.list_cost`), so is its unit price: FOCUS 1.2-1.4 allow
    # neither null on a Usage row (ListUnitPrice, ContractedUnitPrice: "MUST NOT be null when
    # ChargeCategory is Usage"); PricingCategory "Other" and x_Unpriced say it is no price
    unit_prices = ["0" if o.rate is None else num(o.rate) for o in origin]
    sub = [subs[key] for key in zip(b.cluster, b.model, strict=True)]
    sub_ids = [s[0] for s in sub]
    versions = [labels.get(v, "") for v in b.price_version_id]  # type: ignore[arg-type]
    skus = [
        rates.sku_price_id(m, a is None, v)
        for m, a, v in zip(b.model, b.amount, b.price_version_id, strict=True)
    ]
    columns: dict[str, list[str]] = {
        "BilledCost": billed,
        "BillingCurrency": b.currency,
        "ChargeDescription": [description(i) for i in range(n)],
        "ChargePeriodEnd": [p[1] for p in charge_periods],
        "ChargePeriodStart": charge_starts,
        "ConsumedQuantity": consumed,
        "ContractedCost": listed,
        "ContractedUnitPrice": unit_prices,
        "EffectiveCost": billed,
        "ListCost": listed,
        "ListUnitPrice": unit_prices,
        "PricingCategory": ["Other" if u else "Standard" for u in unpriced],
        "PricingQuantity": consumed,
        "ResourceId": b.uuid,
        "ResourceName": [resource_name(*key) for key in zip(b.cluster, b.uuid, b.model, strict=True)],
        "SkuId": [f"gpu-{model.lower()}" for model in b.model],
        "SkuPriceId": skus,
        "SubAccountId": sub_ids,
        "SubAccountName": [s[1] for s in sub],
        "SubAccountType": [s[2] for s in sub],
        "Tags": [_origin_tags(m, c) for m, c in zip(b.model, b.cluster, strict=True)],
        "x_Cluster": b.cluster,
        "x_Container": b.container,
        "x_GpuHours": [scaled(q, QUANTITY_PLACES) for q in b.quantity],
        "x_GpuInstanceId": b.gpu_instance_id,
        "x_GpuModel": b.model,
        "x_GpuUtilizationAvg": list(map(mean_text, b.uw_exact, b.uq)),
        "x_GpuUuid": b.uuid,
        "x_LineKind": [LineKind.UNPRICED.value if u else k for u, k in zip(unpriced, b.kind, strict=True)],
        "x_MigProfile": [p if m else "" for p, m in zip(b.mig_profile, mig, strict=True)],
        # the namespace as Kubernetes names it: a report names a named cluster's `cluster/namespace`
        # (`billing.models.cluster_namespace`); the FOCUS rows carry the cluster in its own columns
        "x_Namespace": [
            ns.removeprefix(f"{c}/") if c else ns for ns, c in zip(b.namespace, b.cluster, strict=True)
        ],
        "x_Pod": b.pod,
        "x_PriceBookVersion": versions,
        "x_SliceHours": [
            scaled(s, QUANTITY_PLACES) if m and k in TENANT_KINDS else ""
            for s, m, k in zip(b.slice_hours, mig, b.kind, strict=True)
        ],
        "x_Team": b.team,
        "x_Unpriced": ["true" if u else "false" for u in unpriced],
        "x_UtilizationEfficiency": list(map(mean_text, b.ew_exact, b.eq)),
    }
    if allocations is not None:
        allocated = allocations.columns(b, origin, part, charge_starts, skus, sub_ids)
        columns.update(zip(ALLOCATION_COLUMNS, allocated, strict=True))
    return columns


def _description(unpriced: bool, version: int | None, model: str, labels: dict[int, str]) -> str:
    if not unpriced:
        return f"GPU time on {model}, split among its holders and the platform (x_LineKind)"
    if version is None:
        return f"Unpriced GPU model {model}: no price-book version in effect for the hour; quantity only, not billed"
    return (
        f"Unpriced GPU model {model}: price-book version {labels.get(version, '')} "
        "has no rate for it; quantity only, not billed"
    )


def report_csv_parts(
    report: Report,
    *,
    account: str = "gpumeter",
    service: str = "Kubernetes GPU",
    version: str = FOCUS_VERSION,
    keep_formulas: bool = False,
) -> Iterator[str]:
    """A report's FOCUS file in parts, made a bucket at a time from its columns (`iter_columns`), their
    formula-leading text cells made inert column by column there unless ``keep_formulas``."""
    focus_columns = iter_columns(
        report, account=account, service=service, version=version, keep_formulas=keep_formulas
    )
    alike = _alike(report, account, service, keep_formulas)
    plain = [
        at
        for at, name in enumerate(HEADERS[version])
        if name in _WRITTEN or (name in alike and csvfile.is_plain(alike[name]))
    ]
    return csvfile.column_parts(
        HEADERS[version], focus_columns, quote_all=False, keep_formulas=True, plain=plain
    )


# --- the schema check ---------------------------------------------------------------------------------
