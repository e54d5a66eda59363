"""The FOCUS 1.3 export, checked by the project's own schema test against the 1.3 column definitions
as the spec's public text states them (tests/reports/focus_checks.py), and the split cost allocation of
docs/billing.md's worked examples (a) and (b) read back from it to the cent."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from decimal import Decimal
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpumeter import contract
from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.pricing import load_price_book
from gpumeter.reports import focus
from gpumeter.reports.focus_allocations import holder_tags, json_text
from gpumeter.reports.focus_columns import TAG_PREFIX
from gpumeter.reports.model import HOUR, build_report, month_period, range_period
from gpumeter.reports.render import render
from tests.billing.factories import A100, H100, HOUR0, alloc, book, gpu_hour, mig, write_book
from tests.reports.focus_checks import COLUMNS, rows_of, schema_problems

NOVEMBER = month_period("2026-11")
FIRST_HOUR = "2026-11-01T00:00:00Z"


def _export(ledger, tmp_path, grain: str = "day") -> Path:
    render(build_report(ledger, NOVEMBER, "team", grain=grain), tmp_path, ("focus",))
    return tmp_path / "gpumeter-2026-11-focus-1.3.csv"


def test_the_definitions_are_the_spec_text_named():
    for name, spec in COLUMNS.items():
        source = spec["source"]
        assert source["repository"] == "FinOps-Open-Cost-and-Usage-Spec/FOCUS_Spec", name
        assert source["path"].startswith("specification/") and source["path"].endswith(".md"), name
        assert spec["data_type"] in ("String", "Decimal", "Date/Time", "JSON"), name
    introduced = {n for n, s in COLUMNS.items() if s.get("introduced") == "1.3"}
    assert introduced == {
        "AllocatedMethodDetails",
        "AllocatedMethodId",
        "AllocatedResourceId",
        "AllocatedResourceName",
        "AllocatedTags",
        "ContractApplied",
        "HostProviderName",
        "ServiceProviderName",
    }
    assert COLUMNS["ProviderName"]["deprecated"] == "1.3" and not COLUMNS["ProviderName"]["allows_nulls"]


def test_the_13_export_meets_the_13_definitions(worked_ledger, tmp_path):
    for grain in ("day", "hour"):
        path = _export(worked_ledger, tmp_path / grain, grain)
        assert schema_problems(path) == [], grain
        assert focus.check_file(path) == [], grain  # the project's own check agrees
    # and the schema test fails on what breaks the definitions
    header, rows = rows_of(path)
    split = next(i for i, r in enumerate(rows) if r["AllocatedMethodId"])
    for column, value, expected in (
        ("AllocatedMethodDetails", '{"Elements": []}', "AllocatedMethodDetails: Elements must be"),
        ("AllocatedMethodDetails", '{"Elements": [{"UsageQuantity": 1}]}', "AllocatedRatio must be numeric"),
        ("AllocatedResourceName", "", "AllocatedResourceName: null exactly"),
        ("HostProviderName", "", "HostProviderName: null"),
        ("ChargeCategory", "GPU", "ChargeCategory: not an allowed value"),
    ):
        broken = [dict(r) for r in rows]
        broken[split][column] = value
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=header, lineterminator="\r\n")
        writer.writeheader()
        writer.writerows(broken)
        target = tmp_path / "broken.csv"
        target.write_text(out.getvalue(), newline="")
        assert any(expected in p for p in schema_problems(target)), (column, schema_problems(target))


def _first_hour(ledger, tmp_path, uuid: str) -> list[dict[str, str]]:
    _header, rows = rows_of(_export(ledger, tmp_path, "hour"))
    return [r for r in rows if r["x_GpuUuid"] == uuid and r["ChargePeriodStart"] == FIRST_HOUR]


def _details(row: dict[str, str]) -> dict:
    return json.loads(row["AllocatedMethodDetails"])


def test_worked_example_a_mig_slices_as_allocatedrows_of(worked_ledger, tmp_path):
    # (a) A100-40GB at $3.00, compute weights: team-a 3g 1.28, team-b 2g 0.86 + 1g 0.43, one 1g unheld 0.43
    rows = {(r["x_LineKind"], r["x_Pod"]): r for r in _first_hour(worked_ledger, tmp_path, "GPU-a")}
    assert {k: r["BilledCost"] for k, r in rows.items()} == {
        ("tenant", "a-0"): "1.28",
        ("tenant", "b-0"): "0.86",
        ("tenant", "b-1"): "0.43",
        ("unallocated", ""): "0.43",
    }
    assert sum(Decimal(r["BilledCost"]) for r in rows.values()) == Decimal("3.00")
    assert {r["AllocatedMethodId"] for r in rows.values()} == {"gpumeter.mig-slice-weight"}
    team_a = rows[("tenant", "a-0")]
    details = _details(team_a)
    # weight 3/7 of the GPU, 3 slice-hours held, 1.28 of the 3.00 the GPU-hour cost
    assert (details["x_Policy"], details["x_Weight"], details["x_SharingEfficiency"]) == (
        "compute",
        0.428571,
        1.0,
    )
    assert details["Elements"] == [
        {"AllocatedRatio": 0.426666666667, "UsageQuantity": 3.0, "UsageUnit": "Slice-Hours"}
    ]
    assert details["x_OriginCharge"] == {
        "BilledCost": "3.00",
        "ChargePeriodStart": FIRST_HOUR,
        "ResourceId": "GPU-a",
        "SkuPriceId": team_a["SkuPriceId"],
        "SubAccountId": "pool/A100-40GB",
    }
    assert details["x_PriceBookVersion"] == team_a["x_PriceBookVersion"] != ""
    assert (team_a["AllocatedResourceId"], team_a["AllocatedResourceName"]) == (
        "team-a/a-0/main",
        "team-a/a-0",
    )
    assert json.loads(team_a["AllocatedTags"])["gpumeter/team"] == "alpha"
    assert [_details(rows[("tenant", p)])["x_Weight"] for p in ("b-0", "b-1")] == [0.285714, 0.142857]
    unallocated = rows[("unallocated", "")]
    assert (unallocated["AllocatedResourceId"], unallocated["AllocatedTags"]) == ("", "")
    assert _details(unallocated)["x_LineKind"] == "unallocated"
    ratios = [e["AllocatedRatio"] for r in rows.values() for e in _details(r)["Elements"]]
    assert abs(sum(ratios) - 1) < 1e-9


def test_worked_example_b_time_sliced_replicas_as_allocatedrows_of(worked_ledger, tmp_path):
    # (b) H100 at $6.88, time_slicing efficiency 0.75, 4 replicas: p1-p3 1.29 each, p4 (half the
    # hour) 0.65, shortfall 1.50, unallocated 0.86
    rows = {(r["x_LineKind"], r["x_Pod"]): r for r in _first_hour(worked_ledger, tmp_path, "GPU-h")}
    assert {k: r["BilledCost"] for k, r in rows.items()} == {
        ("tenant", "p1"): "1.29",
        ("tenant", "p2"): "1.29",
        ("tenant", "p3"): "1.29",
        ("tenant", "p4"): "0.65",
        ("sharing_shortfall", ""): "1.5",
        ("unallocated", ""): "0.86",
    }
    assert sum(Decimal(r["BilledCost"]) for r in rows.values()) == Decimal("6.88")
    assert {r["AllocatedMethodId"] for r in rows.values()} == {"gpumeter.time-slicing-share"}
    for pod, held, ratio in (("p1", 0.25, 0.1875), ("p4", 0.125, 0.094476744186)):  # 1.29 / 6.88, 0.65 / 6.88
        details = _details(rows[("tenant", pod)])
        assert (details["x_Policy"], details["x_Share"], details["x_SharingEfficiency"]) == (
            "equal",
            0.25,
            0.75,
        )
        assert details["Elements"] == [
            {"AllocatedRatio": ratio, "UsageQuantity": held, "UsageUnit": "GPU-Hours"}
        ]
    shortfall = rows[("sharing_shortfall", "")]
    assert shortfall["AllocatedResourceId"] == "" and _details(shortfall)["x_LineKind"] == "sharing_shortfall"
    ratios = [e["AllocatedRatio"] for r in rows.values() for e in _details(r)["Elements"]]
    assert abs(sum(ratios) - 1) < 1e-9


def test_a_gpu_held_whole_is_no_split(worked_ledger, tmp_path):
    # (c) the H100 research holds whole for 20 days, then nobody: each GPU-day is one row, its own
    # origin charge, so no allocation columns; the holder is in the x_ columns, Tags are the GPU's
    _header, rows = rows_of(_export(worked_ledger, tmp_path))
    research = [r for r in rows if r["x_GpuUuid"] == "GPU-c"]
    assert research and all(r["AllocatedMethodId"] == r["AllocatedMethodDetails"] == "" for r in research)
    tenant = next(r for r in research if r["x_LineKind"] == "tenant")
    assert (tenant["x_Team"], tenant["x_Namespace"]) == ("gamma", "research")
    assert json.loads(tenant["Tags"]) == {"gpumeter/gpu_model": "H100-80GB", "gpumeter/pool": "H100-80GB"}
    assert all(r["ServiceProviderName"] == r["HostProviderName"] == "gpumeter" for r in rows)


def _shared_modes_ledger(ledger, tmp_path):
    """One hour of four H100s at $6.88, one per remaining method: (k) time-sliced replicas split by
    use, (h) MPS replicas, (i) fractional grants (compute), (j) vGPUs (docs/billing.md §8)."""
    prices = book(
        tmp_path,
        {"H100-80GB": {"hourly_rate": "6.88"}},
        sharing_efficiency={"time_slicing": "0.75", "mps": "0.90", "vgpu": "0.85"},
        sharing_split="usage",
    )

    def replica(u, ns, pod, sharing, sm=None, memory=None, share="0.25"):
        return dataclasses.replace(
            alloc(u, ns, pod, share=share),
            sharing=sharing,
            process_sm=None if sm is None else Decimal(sm),
            process_memory=None if memory is None else Decimal(memory),
        )

    gib = 1024**3
    grants = {"a": ("0.50", "0.30"), "b": ("0.25", "0.50"), "c": ("0.125", "0.125")}
    hours = [
        gpu_hour(
            "GPU-k",
            H100,
            allocations=[
                replica("GPU-k", "data-eng", "etl-0", "time_slicing", "0.05", 30 * gib),
                replica("GPU-k", "data-eng", "etl-1", "time_slicing", "0.15", 20 * gib),
                replica("GPU-k", "data-eng", "etl-2", "time_slicing", "0.02", 5 * gib),
            ],
        ),
        gpu_hour(
            "GPU-m", H100, allocations=[replica("GPU-m", "inference", f"p{i}", "mps") for i in (1, 2, 3)]
        ),
        gpu_hour(
            "GPU-f",
            H100,
            allocations=[
                dataclasses.replace(
                    alloc("GPU-f", "ml", pod, share=compute),
                    sharing="fractional",
                    memory_share=Decimal(memory),
                    compute_share=Decimal(compute),
                )
                for pod, (memory, compute) in grants.items()
            ],
        ),
        gpu_hour("GPU-v", H100, allocations=[replica("GPU-v", "vms", f"vm-{i}", "vgpu") for i in (1, 2, 3)]),
    ]
    lines = [line for gh in hours for line in price_gpu_hour(gh, prices).lines]
    ledger.write_hour(HourRecord(HOUR0, hours, lines, prices))


def test_every_sharing_mode_has_its_method(ledger, tmp_path):
    _shared_modes_ledger(ledger, tmp_path)
    path = _export(ledger, tmp_path / "out", "hour")
    assert schema_problems(path) == [] and focus.check_file(path) == []
    _header, rows = rows_of(path)

    def gpu(uuid):
        return {r["x_Pod"] or r["x_LineKind"]: r for r in rows if r["x_GpuUuid"] == uuid}

    expected = {  # docs/billing.md §8 (k), (h), (i) `compute`, (j)
        "GPU-k": (
            "gpumeter.usage-split",
            {"etl-0": "0.88", "etl-1": "2.64", "etl-2": "0.35"},
            "1.29",
            "1.72",
        ),
        "GPU-m": ("gpumeter.mps-share", {"p1": "1.55", "p2": "1.55", "p3": "1.55"}, "0.51", "1.72"),
        "GPU-f": ("gpumeter.fractional-grant", {"a": "2.06", "b": "3.44", "c": "0.86"}, None, "0.52"),
        "GPU-v": ("gpumeter.vgpu-share", {"vm-1": "1.46", "vm-2": "1.46", "vm-3": "1.46"}, "0.78", "1.72"),
    }
    for uuid, (method, tenants, shortfall, unallocated) in expected.items():
        got = gpu(uuid)
        assert {r["AllocatedMethodId"] for r in got.values()} == {method}, uuid
        assert {p: got[p]["BilledCost"] for p in tenants} == tenants, uuid
        assert got["unallocated"]["BilledCost"] == unallocated, uuid
        if shortfall:
            assert Decimal(got["sharing_shortfall"]["BilledCost"]) == Decimal(shortfall), uuid
        assert sum(Decimal(r["BilledCost"]) for r in got.values()) == Decimal("6.88"), uuid
    k = _details(gpu("GPU-k")["etl-1"])
    assert (k["x_Policy"], k["x_Share"], k["x_SharingEfficiency"]) == ("usage", 0.25, 0.75)
    assert _details(gpu("GPU-m")["p1"])["x_SharingEfficiency"] == 0.9
    a = _details(gpu("GPU-f")["a"])
    assert (a["x_Policy"], a["x_MemoryShare"], a["x_ComputeShare"], a["x_SharingEfficiency"]) == (
        "compute",
        0.5,
        0.3,
        1.0,
    )
    assert _details(gpu("GPU-v")["vm-1"])["x_SharingEfficiency"] == 0.85


def test_a_cluster_is_the_sub_account_of_every_row_of_its_origins(worked_ledger):
    report = build_report(worked_ledger, NOVEMBER, "team", grain="hour")
    east = {"GPU-a", "GPU-h"}
    # the lines of two GPUs as a store labelling them cluster "east" gives them: the cluster on the
    # line, a tenant's namespace named `east/<namespace>` by the report (reports.grouped.name_clusters)
    report.charges = [
        dataclasses.replace(
            c,
            cluster="east",
            namespace=f"east/{c.namespace}" if c.kind in ("tenant", "idle_share") else c.namespace,
        )
        if c.uuid in east
        else c
        for c in report.charges
    ]
    for version in focus.VERSIONS:
        rows = focus.rows(report, version=version)
        first_hour = [r for r in rows if r["ChargePeriodStart"] == FIRST_HOUR]
        clustered = [r for r in first_hour if r["x_GpuUuid"] in east]
        assert len(clustered) == 10  # example (a)'s four rows and (b)'s six
        assert {(r["SubAccountId"], r["SubAccountName"], r["SubAccountType"]) for r in clustered} == {
            ("east", "east", "Cluster")
        }
        assert {r["x_Cluster"] for r in clustered} == {"east"}
        assert {json.loads(r["Tags"])["gpumeter/cluster"] for r in clustered} == {"east"}
        # the namespace as Kubernetes names it, the cluster in its own columns
        assert {r["x_Namespace"] for r in clustered if r["x_LineKind"] == "tenant"} == {
            "team-a",
            "team-b",
            "inference",
        }
        # a line without a cluster keeps its GPU pool
        others = [r for r in first_hour if r["x_GpuUuid"] == "GPU-d"]
        assert others and {(r["SubAccountId"], r["x_Cluster"]) for r in others} == {("pool/A100-40GB", "")}


def test_a_platform_row_takes_the_methods_of_its_own_cluster_s_gpu(ledger, tmp_path):
    """Two clusters whose GPUs share a UUID (a cloned node image, a simulated fleet in each) hold two
    GPUs: east's GPU is MIG-partitioned with an instance idle, west's is time-sliced. The unallocated
    part of east's GPU-hour is split by MIG's method alone; read by UUID, it took west's time-slicing
    too (x_Methods listing both)."""
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    u = "GPU-twin"
    east = gpu_hour(
        u,
        A100,
        [mig(u, "1", "3g.20gb"), mig(u, "2", "3g.20gb")],
        [alloc(u, "ml", "a", gi="1", profile="3g.20gb")],
    )
    west = gpu_hour(u, A100, [], [alloc(u, "web", "b", share="0.5"), alloc(u, "web", "c", share="0.5")])
    east = dataclasses.replace(east, device=dataclasses.replace(east.device, cluster="east"))
    west = dataclasses.replace(west, device=dataclasses.replace(west.device, cluster="west"))
    lines = price_gpu_hour(east, prices).lines + price_gpu_hour(west, prices).lines
    ledger.write_hour(HourRecord(HOUR0, [east, west], lines, prices))
    report = build_report(ledger, range_period(HOUR0, HOUR0 + HOUR), "team", grain="hour", compare=False)
    rows = focus.rows(report)
    platform = [
        r for r in rows if r["x_Cluster"] == "east" and r["x_LineKind"] not in ("tenant", "idle_share")
    ]
    assert platform, "east's idle instance is a platform line of its GPU-hour"
    mig_method = focus.METHODS[contract.SHARING_MIG].id
    for row in platform:
        details = json.loads(row["AllocatedMethodDetails"])
        assert (row["AllocatedMethodId"], details.get("x_Methods")) == (mig_method, None)
    west_rows = [r for r in rows if r["x_Cluster"] == "west" and r["x_LineKind"] == "tenant"]
    assert {r["AllocatedMethodId"] for r in west_rows} == {focus.METHODS[contract.SHARING_TIME_SLICING].id}


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=5), st.text(max_size=5), st.text(max_size=5), st.text(max_size=5))
@example('"ns"', "pod\n", "", "é\u2028\x00")
def test_a_holders_tags_are_the_json_encoders_text(namespace, pod, container, team):
    holder = {"namespace": namespace, "pod": pod, "container": container, "team": team}
    assert holder_tags(namespace, pod, container, team) == json_text(
        {f"{TAG_PREFIX}{k}": v for k, v in holder.items() if v}
    )


# an A100 at 3.00, then 4.00 from 13:30 on 2026-11-01: the day's hours from 14:00 on take the second
MID_DAY_CHANGE = {
    "currency": "USD",
    "versions": [
        {"effective_from": "2026-01-01T00:00:00Z", "gpus": {"A100-40GB": {"hourly_rate": "3.00"}}},
        {"effective_from": "2026-11-01T13:30:00Z", "gpus": {"A100-40GB": {"hourly_rate": "4.00"}}},
    ],
}


def test_a_price_change_inside_a_day_gives_two_origin_charges_each_its_hours(ledger, tmp_path):
    """A version from 13:30 prices the day's hours from 14:00 on (an hour takes the version in effect at
    its start): at day grain the GPU-day is two origin charges, told apart by their periods,
    [00:00, 14:00) at 3.00 and [14:00, 24:00) at 4.00, each of whose rows name it and sum to it.
    Before, both claimed the whole day, and an unpriced GPU's two were told apart by nothing."""
    prices = load_price_book(write_book(tmp_path, MID_DAY_CHANGE))
    for h in range(24):
        hour = HOUR0 + HOUR * h
        hours = [
            gpu_hour("GPU-a", A100, allocations=[alloc("GPU-a", "ml", "p", seconds=1800)], hour=hour),
            gpu_hour("GPU-u", "NVIDIA VR200", allocations=[alloc("GPU-u", "ml", "q")], hour=hour),
        ]
        lines = [line for gh in hours for line in price_gpu_hour(gh, prices).lines]
        ledger.write_hour(HourRecord(hour, hours, lines, prices))
    path = _export(ledger, tmp_path / "out", "day")
    assert schema_problems(path) == [] and focus.check_file(path) == []
    _header, rows = rows_of(path)

    origins: dict[tuple[str, str, str], list[dict]] = {}
    for row in rows:
        origins.setdefault((row["ResourceId"], row["ChargePeriodStart"], row["ChargePeriodEnd"]), []).append(
            row
        )
    assert sorted(origins) == [
        ("GPU-a", "2026-11-01T00:00:00Z", "2026-11-01T14:00:00Z"),
        ("GPU-a", "2026-11-01T14:00:00Z", "2026-11-02T00:00:00Z"),
        ("GPU-u", "2026-11-01T00:00:00Z", "2026-11-01T14:00:00Z"),
        ("GPU-u", "2026-11-01T14:00:00Z", "2026-11-02T00:00:00Z"),
    ]

    def billed(uuid: str, start: str) -> Decimal:
        (key,) = [k for k in origins if k[:2] == (uuid, start)]
        group = origins[key]
        for row in group:  # each row names its own origin charge
            if row["AllocatedMethodDetails"]:
                charge = json.loads(row["AllocatedMethodDetails"])["x_OriginCharge"]
                assert (charge["ResourceId"], charge["ChargePeriodStart"]) == (uuid, start)
        assert len({r["ListUnitPrice"] for r in group}) == 1
        return sum((Decimal(r["BilledCost"]) for r in group), Decimal(0))

    # 14 hours x 3.00 and 10 hours x 4.00, half held by the pod and half the platform's
    assert billed("GPU-a", "2026-11-01T00:00:00Z") == Decimal("42.00")
    assert billed("GPU-a", "2026-11-01T14:00:00Z") == Decimal("40.00")
    assert billed("GPU-u", "2026-11-01T00:00:00Z") == billed("GPU-u", "2026-11-01T14:00:00Z") == 0


def test_a_sku_price_id_stays_while_its_models_terms_do(ledger, tmp_path):
    """FOCUS: SkuPriceId "MUST remain consistent over time". It was the book file's digest and the
    version's start, so a comment added to the book, or a new version for another model, gave every
    SKU a new one. Day 1 is priced by a book, day 2 by the same book with a comment added and a version
    from Nov 2 that changes the H100's rate only: the A100 keeps its SkuPriceId, the H100 gets a new one,
    and x_PriceBookVersion still tells the two days' versions apart."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = {"effective_from": "2026-01-01T00:00:00Z", "gpus": {"A100-40GB": {"hourly_rate": "3.00"}}}
    first["gpus"]["H100-80GB"] = {"hourly_rate": "6.88"}
    day1 = load_price_book(write_book(tmp_path / "a", {"currency": "USD", "versions": [first]}))
    second = {"effective_from": "2026-11-02T00:00:00Z", "gpus": {**first["gpus"]}}
    second["gpus"]["H100-80GB"] = {"hourly_rate": "4.90"}
    path = write_book(tmp_path / "b", {"currency": "USD", "versions": [first, second]})
    path.write_text("# the same prices, and a comment\n" + path.read_text())
    day2 = load_price_book(path)
    for h in range(48):
        hour, prices = HOUR0 + HOUR * h, (day1 if h < 24 else day2)
        hours = [gpu_hour("GPU-a", A100, hour=hour), gpu_hour("GPU-h", H100, hour=hour)]
        lines = [line for gh in hours for line in price_gpu_hour(gh, prices).lines]
        ledger.write_hour(HourRecord(hour, hours, lines, prices))
    path = _export(ledger, tmp_path / "out", "day")
    assert schema_problems(path) == [] and focus.check_file(path) == []
    _header, rows = rows_of(path)
    skus = {(r["ResourceId"], r["ChargePeriodStart"][:10]): r["SkuPriceId"] for r in rows}
    assert skus[("GPU-a", "2026-11-01")] == skus[("GPU-a", "2026-11-02")]
    assert skus[("GPU-h", "2026-11-01")] != skus[("GPU-h", "2026-11-02")]
    # each day's version is still named apart: another file's digest, another start
    assert len({r["x_PriceBookVersion"] for r in rows}) == 2
    assert {(r["ResourceId"], r["ListUnitPrice"]) for r in rows} == {
        ("GPU-a", "3"),
        ("GPU-h", "6.88"),
        ("GPU-h", "4.9"),
    }
