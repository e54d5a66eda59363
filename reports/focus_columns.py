"""The FOCUS catalog: the versions written, each version's columns (name, nullable, type) in output
order, the mandatory ones, the allowed values, gpumeter's custom columns, and the split cost
allocation methods (docs/reports.md, "FOCUS mapping"). Read by the export (`reports.focus`) and by
its schema check (`reports.focus_check`)."""

from __future__ import annotations

from dataclasses import dataclass

from gpumeter import contract
from gpumeter.billing.models import LineKind

VERSIONS = ("1.3", "1.4", "1.2")  # the first is the default (docs/reports.md, "FOCUS 1.4")
FOCUS_VERSION = VERSIONS[0]

# (column, nullable, type) in output order. Types: decimal, datetime, string, json, or an allowed-value set.
CHARGE_CATEGORIES = {"Usage", "Purchase", "Tax", "Credit", "Adjustment"}
CHARGE_CLASSES = {"Correction"}
CHARGE_FREQUENCIES = {"One-Time", "Recurring", "Usage-Based"}
PRICING_CATEGORIES = {"Standard", "Dynamic", "Committed", "Other"}
SERVICE_CATEGORIES = {
    "AI and Machine Learning",
    "Analytics",
    "Business Applications",
    "Compute",
    "Databases",
    "Developer Tools",
    "Multicloud",
    "Identity",
    "Integration",
    "Internet of Things",
    "Management and Governance",
    "Media",
    "Migration",
    "Mobile",
    "Networking",
    "Security",
    "Storage",
    "Web",
    "Other",
}
SERVICE_SUBCATEGORIES = {
    "Compute": {
        "Bare Metal",
        "Containers",
        "End User Computing",
        "Quantum Compute",
        "Serverless Compute",
        "Virtual Machines",
        "Other (Compute)",
    },
    "AI and Machine Learning": {
        "AI Platforms",
        "Bots",
        "Generative AI",
        "Machine Learning",
        "Natural Language Processing",
        "Other (AI and Machine Learning)",
    },
}

COLUMNS: list[tuple[str, bool, object]] = [
    ("BilledCost", False, "decimal"),
    ("BillingAccountId", False, "string"),
    ("BillingAccountName", True, "string"),
    ("BillingCurrency", False, "currency"),
    ("BillingPeriodEnd", False, "datetime"),
    ("BillingPeriodStart", False, "datetime"),
    ("ChargeCategory", False, CHARGE_CATEGORIES),
    ("ChargeClass", True, CHARGE_CLASSES),
    ("ChargeDescription", True, "string"),
    ("ChargeFrequency", False, CHARGE_FREQUENCIES),
    ("ChargePeriodEnd", False, "datetime"),
    ("ChargePeriodStart", False, "datetime"),
    ("ConsumedQuantity", True, "decimal"),
    ("ConsumedUnit", True, "unit"),
    ("ContractedCost", False, "decimal"),
    ("ContractedUnitPrice", True, "decimal"),
    ("EffectiveCost", False, "decimal"),
    ("InvoiceId", True, "string"),
    ("InvoiceIssuerName", False, "string"),
    ("ListCost", False, "decimal"),
    ("ListUnitPrice", True, "decimal"),
    ("PricingCategory", True, PRICING_CATEGORIES),
    ("PricingQuantity", True, "decimal"),
    ("PricingUnit", True, "unit"),
    ("ProviderName", False, "string"),
    ("PublisherName", False, "string"),
    ("ResourceId", True, "string"),
    ("ResourceName", True, "string"),
    ("ResourceType", True, "string"),
    ("ServiceCategory", False, SERVICE_CATEGORIES),
    ("ServiceName", False, "string"),
    ("ServiceSubcategory", True, "subcategory"),
    ("SkuId", True, "string"),
    ("SkuPriceId", True, "string"),
    ("SubAccountId", True, "string"),
    ("SubAccountName", True, "string"),
    ("SubAccountType", True, "string"),
    ("Tags", True, "json"),
]
MANDATORY = {
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "ContractedCost",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "ServiceCategory",
    "ServiceName",
}
CUSTOM: list[tuple[str, bool, object]] = sorted(  # alphabetical (docs/reports.md, "FOCUS mapping")
    [
        ("x_Cluster", True, "string"),  # the ledger line's cluster, where it names one
        ("x_Container", True, "string"),
        ("x_GpuHours", False, "decimal"),  # the weighted GPU-hours the ledger line states
        ("x_GpuInstanceId", True, "string"),
        ("x_GpuModel", True, "string"),
        ("x_GpuUtilizationAvg", True, "decimal"),
        ("x_GpuUuid", False, "string"),
        ("x_LineKind", False, {kind.value for kind in LineKind}),
        ("x_MigProfile", True, "string"),
        ("x_Namespace", False, "string"),
        ("x_Pod", True, "string"),
        ("x_PriceBookVersion", True, "string"),
        ("x_SliceHours", True, "decimal"),
        ("x_Team", True, "string"),
        ("x_Unpriced", False, {"true", "false"}),
        ("x_UtilizationEfficiency", True, "decimal"),
    ]
)
# FOCUS 1.3: the 1.2 columns (ProviderName and PublisherName deprecated, still mandatory) and these
# (tests/reports/data/focus-1.3-columns.json names the spec text of each).
ADDED_IN_13: list[tuple[str, bool, object]] = [
    ("AllocatedMethodDetails", True, "allocation"),
    ("AllocatedMethodId", True, "string"),
    ("AllocatedResourceId", True, "string"),
    ("AllocatedResourceName", True, "string"),
    ("AllocatedTags", True, "json"),
    ("ContractApplied", True, "json"),  # null: no contract commitments
    ("HostProviderName", False, "string"),
    ("ServiceProviderName", False, "string"),
]
COLUMNS_13 = sorted(COLUMNS + ADDED_IN_13)
MANDATORY_13 = MANDATORY | {"HostProviderName", "ServiceProviderName"}
# FOCUS 1.4's cost-and-usage dataset: 1.3's columns less ProviderName and PublisherName, which 1.4
# removes (docs/reports.md, "FOCUS 1.4"); its new columns are conditional on features gpumeter has not
REMOVED_IN_14 = {"ProviderName", "PublisherName"}
COLUMNS_14 = [c for c in COLUMNS_13 if c[0] not in REMOVED_IN_14]
MANDATORY_14 = MANDATORY_13 - REMOVED_IN_14
HEADER = [c[0] for c in COLUMNS] + [c[0] for c in CUSTOM]  # 1.2
HEADERS = {
    "1.2": HEADER,
    "1.3": [c[0] for c in COLUMNS_13] + [c[0] for c in CUSTOM],
    "1.4": [c[0] for c in COLUMNS_14] + [c[0] for c in CUSTOM],
}
COLUMN_SPEC = {name: (nullable, kind) for name, nullable, kind in COLUMNS_13 + CUSTOM}


@dataclass(frozen=True)
class Method:
    """A split cost allocation method: its AllocatedMethodId and what it splits by (docs/reports.md,
    "Allocation methods"; docs/billing.md names the rule of each)."""

    id: str
    usage_unit: str  # AllocatedMethodDetails' UsageUnit: what the holder's UsageQuantity counts
    policy: str  # the price-book setting that chose the split (x_Policy)
    what: str


# by sharing mode (contract.SHARING_*), plus "usage" (a replica split by use) and the idle spread
METHODS: dict[str, Method] = {
    contract.SHARING_MIG: Method(
        "gpumeter.mig-slice-weight", "Slice-Hours", "slice_weight", "MIG instance by its slice weight"
    ),
    contract.SHARING_TIME_SLICING: Method(
        "gpumeter.time-slicing-share", "GPU-Hours", "sharing_split", "time-sliced replica by its share"
    ),
    contract.SHARING_MPS: Method(
        "gpumeter.mps-share", "GPU-Hours", "sharing_split", "MPS replica by its share"
    ),
    contract.SHARING_FRACTIONAL: Method(
        "gpumeter.fractional-grant", "GPU-Hours", "slice_weight", "fractional grant by the fraction granted"
    ),
    contract.SHARING_VGPU: Method(
        "gpumeter.vgpu-share", "GPU-Hours", "sharing_split", "VM's vGPU by its share"
    ),
    "usage": Method(
        "gpumeter.usage-split", "GPU-Hours", "sharing_split", "replicas' pot split by their processes' use"
    ),
    LineKind.IDLE_SHARE: Method(
        "gpumeter.idle-spread", "GPU-Hours", "idle", "idle capacity spread by tenant amounts"
    ),
    # a whole GPU held by one holder for part of its hours, or by holders one after another
    "whole": Method("gpumeter.whole-gpu-time", "GPU-Hours", "", "whole GPU by the hours each holder held it"),
}
WHOLE_GPU_METHOD = "whole"
METHOD_PRECEDENCE = list(METHODS)  # a platform line takes the first method among its GPU-hour's holders


TAG_PREFIX = "gpumeter/"  # the data generator-defined tag scheme of Tags and AllocatedTags
ALLOCATION_COLUMNS = (
    "AllocatedMethodDetails",
    "AllocatedMethodId",
    "AllocatedResourceId",
    "AllocatedResourceName",
    "AllocatedTags",
)
METHOD_IDS = {m.id for m in METHODS.values()}
