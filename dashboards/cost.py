"""Cost & chargeback: cost and GPU-hours by team, namespace, GPU model and MIG profile from the billing
service's cost series; what stays with the platform (unallocated, stranded, sharing shortfall) and
what is not priced yet; and how well the paid-for GPUs are used.

The billing collector renders ledger totals (counters that grow each ingested hour), so "in the time
range" is the growth of the total over the dashboard's range (core.in_range)."""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.builders import dashboard as d

from gpumeter import contract

from .core import (
    MERGE,
    NAMESPACE_GPU_EQUIVALENTS,
    SHARE,
    STAT,
    TABLE,
    UID_COST,
    UID_MIG,
    Panel,
    Query,
    Section,
    dashboard,
    in_range,
    link,
    organize,
    query_var,
    steps,
    unit_override,
    url,
)

SEL = 'team=~"$team", namespace=~"$namespace", currency=~"$currency"'
COST = f"{contract.BILLING_COST.name}{{{SEL}}}"
TENANT = f'{contract.BILLING_COST.name}{{{SEL}, kind=~"tenant|idle_share"}}'
ALL_COST = f'{contract.BILLING_COST.name}{{currency=~"$currency"}}'
ALL_TENANT = f'{contract.BILLING_COST.name}{{currency=~"$currency", kind=~"tenant|idle_share"}}'
PLATFORM = f'{contract.BILLING_UNALLOCATED_COST.name}{{currency=~"$currency"}}'
HOURS = f'{contract.BILLING_GPU_HOURS.name}{{team=~"$team", namespace=~"$namespace"}}'
UNPRICED = contract.BILLING_UNPRICED_GPU_HOURS.name
TEAM_SEL = 'team=~"$team", currency=~"$currency"'
MONTH_TO_DATE = f"{contract.BILLING_TEAM_MONTH_TO_DATE.name}{{{TEAM_SEL}}}"
BUDGET = f"{contract.BILLING_TEAM_BUDGET.name}{{{TEAM_SEL}}}"
FORECAST = f"{contract.BILLING_TEAM_FORECAST.name}{{{TEAM_SEL}}}"
MONEY = "none"  # the price book's currency is a label (currency variable), not a fixed Grafana unit

TO_MIG = link(
    "MIG & pods of namespace ${__data.fields.namespace}", url(UID_MIG, namespace="${__data.fields.namespace}")
)
TO_NAMESPACE = link(
    "Cost of namespace ${__data.fields.namespace}", url(UID_COST, namespace="${__data.fields.namespace}")
)
TO_TEAM = link("Cost of team ${__data.fields.team}", url(UID_COST, team="${__data.fields.team}"))


def chargeback(title: str, by: str, *, description: str = "", links: Sequence[d.DashboardLink] = ()) -> Panel:
    """A table of the tenant cost and weighted GPU-hours in the time range, one line per ``by``."""
    return Panel(
        title,
        [Query(in_range(TENANT, f"{by}, currency"), table=True), Query(in_range(HOURS, by), table=True)],
        kind=TABLE,
        description=description,
        overrides=[unit_override("cost", MONEY), unit_override("GPU-hours", "h")],
        transformations=[MERGE, organize(rename={"Value #A": "cost", "Value #B": "GPU-hours"})],
        links=links,
        decimals=2,
        sort_by="cost",
    )


PANELS: tuple[Section | Panel, ...] = (
    Section("In the time range ($currency)"),
    Panel(
        "Total GPU cost",
        Query(in_range(ALL_COST, "currency")),
        unit=MONEY,
        kind=STAT,
        description="Every priced GPU-hour ingested in the range: tenant and platform lines.",
        decimals=2,
        w=6,
        h=5,
    ),
    Panel(
        "Billed to the selected teams",
        Query(in_range(TENANT, "currency")),
        unit=MONEY,
        kind=STAT,
        decimals=2,
        w=6,
        h=5,
    ),
    Panel(
        "Recovered: tenant share of the cost",
        Query(f"sum({in_range(ALL_TENANT, 'currency')}) / sum({in_range(ALL_COST, 'currency')})"),
        unit="percentunit",
        thresholds=steps((None, "red"), (0.6, "orange"), (0.8, "green")),
        kind=STAT,
        description="Efficiency of the pool as finance sees it: the fraction of the GPU cost billed to "
        "tenants; the rest is unallocated, stranded or given away as sharing discount.",
        w=6,
        h=5,
    ),
    Panel(
        "Unpriced GPU-hours",
        Query(f"sum({in_range(UNPRICED, 'model')}) or vector(0)"),
        unit="h",
        thresholds=steps((None, "green"), (0.001, "red")),
        kind=STAT,
        description="GPU-hours of models missing from the price book: billed nowhere until priced "
        "(gpumeter billing price re-prices them).",
        w=6,
        h=5,
    ),
    Section("Chargeback"),
    chargeback(
        "Cost and GPU-hours by team",
        "team",
        description="Tenant lines (and spread idle, when the price book spreads idle). GPU-hours are "
        "weighted: hours × share × slice weight.",
        links=[TO_TEAM],
    ),
    chargeback("Cost and GPU-hours by namespace", "team, namespace", links=[TO_NAMESPACE, TO_MIG]),
    chargeback(
        "Cost by GPU model and MIG profile",
        "model, mig_profile",
        description="Empty profile: whole (or time-sliced) GPUs.",
    ),
    Panel(
        "Effective rate: cost per weighted GPU-hour, by namespace and model",
        Query(
            f"({in_range(TENANT, 'namespace, model')}) / ({in_range(HOURS, 'namespace, model')} > 0)",
            table=True,
        ),
        unit=MONEY,
        kind=TABLE,
        description="Includes the sharing-efficiency discount (time slicing, MIG) where the price book "
        "sets one.",
        decimals=3,
        transformations=[organize(rename={"Value": "per GPU-hour"})],
        w=12,
        h=8,
    ),
    Panel(
        "Budgets: this calendar month (UTC), by team",
        [
            Query(f"max by (team, currency) ({BUDGET})", table=True),
            Query(f"max by (team, currency) ({MONTH_TO_DATE})", table=True),
            Query(f"max by (team, currency) ({FORECAST})", table=True),
            Query(
                f"max by (team, currency) ({MONTH_TO_DATE}) / max by (team, currency) ({BUDGET})",
                table=True,
            ),
        ],
        kind=TABLE,
        description="Month-to-date: the team's tenant and idle-share lines of this month so far; forecast: "
        "month-to-date + the last 7 whole UTC days' mean hourly cost x the hours left (docs/billing.md "
        "§4.4). Budgets come from the billing team map file; a team without one shows no budget. "
        "Independent of the dashboard's time range.",
        overrides=[
            unit_override("budget", MONEY),
            unit_override("month to date", MONEY),
            unit_override("forecast", MONEY),
            unit_override("used", "percentunit", steps((None, "green"), (0.8, "orange"), (1, "red"))),
        ],
        transformations=[
            MERGE,
            organize(
                rename={
                    "Value #A": "budget",
                    "Value #B": "month to date",
                    "Value #C": "forecast",
                    "Value #D": "used",
                }
            ),
        ],
        links=[TO_TEAM],
        decimals=2,
        w=24,
        h=7,
        sort_by="used",
    ),
    Panel(
        "Cost ingested per hour, by team",
        Query(f"sum by (team) (increase({TENANT}[1h]))", "{{team}}"),
        unit=MONEY,
        description="The growth of each team's total over the last hour at each point: one ingested "
        "GPU-hour of cost (ingest runs hourly, at minute 5).",
        decimals=2,
        w=24,
        stack=True,
    ),
    Section("Platform: unallocated, stranded, unpriced"),
    Panel(
        "Cost left with the platform",
        Query(in_range(PLATFORM, "kind, currency"), table=True),
        unit=MONEY,
        kind=TABLE,
        description="unallocated: instances or GPUs nobody held; stranded: capacity no MIG instance "
        "covers (e.g. the 7th slice under 3g+3g); sharing_shortfall: the discount given to shared "
        "GPUs; utilization_shortfall: the discount of utilization tiers (utilization_tiers: price). "
        "See docs/billing.md §4.",
        decimals=2,
        transformations=[organize(rename={"Value": "cost"})],
        w=8,
        h=7,
    ),
    Panel(
        "Platform cost by GPU model and profile",
        Query(
            in_range(
                f'{contract.BILLING_COST.name}{{currency=~"$currency", kind=~"unallocated|stranded|sharing_shortfall|utilization_shortfall"}}',
                "kind, model, mig_profile, currency",
            ),
            table=True,
        ),
        unit=MONEY,
        kind=TABLE,
        decimals=2,
        transformations=[organize(rename={"Value": "cost"})],
        w=8,
        h=7,
        sort_by="cost",
    ),
    Panel(
        "Unpriced GPU-hours by model",
        Query(in_range(UNPRICED, "model"), table=True),
        unit="h",
        thresholds=steps((None, "green"), (0.001, "red")),
        kind=TABLE,
        description="The NVML model name missing from the price book: add it (or an alias), then "
        "re-price the hours.",
        decimals=2,
        overrides=[unit_override("GPU-hours", "h", steps((None, "green"), (0.001, "red")))],
        transformations=[organize(rename={"Value": "GPU-hours"})],
        w=8,
        h=7,
    ),
    Section("Efficiency: is what is paid for used?"),
    Panel(
        "Utilization of allocations by namespace (now)",
        Query(
            'avg by (namespace) (namespace_pod_container:nvidia_gpu_utilization_ratio:avg{namespace=~"$namespace"})',
            "{{namespace}}",
        ),
        unit=SHARE,
        thresholds=steps((None, "red"), (0.05, "orange"), (0.25, "green")),
        description="Mean utilization of the devices the namespace's pods hold (whole GPUs; MIG "
        "instances on Hopper and later). Low utilization on a high bill is waste.",
        threshold_lines=True,
    ),
    Panel(
        "GPU equivalents held by namespace (now)",
        Query(NAMESPACE_GPU_EQUIVALENTS, "{{namespace}}"),
        description="What each namespace holds at this moment and will be billed for at the next "
        "ingest: whole GPUs count their share, MIG instances compute slices / 7.",
        decimals=2,
        stack=True,
    ),
)


def build() -> d.Dashboard:
    return dashboard(
        UID_COST,
        "gpumeter / Cost & chargeback",
        "Cost and weighted GPU-hours by team, namespace, GPU model and MIG profile, from the billing "
        "ledger (gpumeter_billing_* series). Every GPU-hour's cost lands on a tenant line, "
        "__unallocated__, __stranded__, __sharing_shortfall__ or __utilization_shortfall__; unpriced models are counted apart.",
        [
            query_var(
                "currency",
                "Currency",
                f"label_values({contract.BILLING_COST.name}, currency)",
                multi=False,
                include_all=False,
                description="The price book's currency (ISO 4217).",
            ),
            query_var(
                "team",
                "Team",
                f"label_values({contract.BILLING_COST.name}, team)",
                description="Team of the namespace (team map file or kube-state-metrics label_team).",
            ),
            query_var(
                "namespace",
                "Namespace",
                f'label_values({contract.BILLING_COST.name}{{team=~"$team"}}, namespace)',
                description="Namespaces billed, including the platform lines (__unallocated__, ...).",
            ),
        ],
        PANELS,
        since="now/M",
    )
