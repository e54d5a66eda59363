"""Reports show, per pod on a shared GPU, its own memory and SM utilization where the exporter's
processes collector reported them (issue 15 point 6; docs/billing.md §3.5), not the device's. The
facts are written as billing's ingest writes them, on every ledger backend; the figures are by hand."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from decimal import Decimal

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.reports.model import build_report, range_period
from gpumeter.reports.render import html_text, json_text
from tests.billing.factories import H100, HOUR0, alloc, book, gpu_hour
from tests.reports.helpers import html_tables

D = Decimal
GIB = 1024**3


def _hour(hour, with_data: bool):
    u = "GPU-ts"
    usage = {"etl-0": ("0.05", 30 * GIB), "etl-1": ("0.15", 20 * GIB)}
    allocations = [
        dataclasses.replace(
            alloc(u, "data-eng", pod, share="0.25"),
            sharing="time_slicing",
            utilization=D(sm) if with_data else D("0.55"),  # the device's, without process data
            process_sm=D(sm) if with_data else None,
            process_memory=D(memory) if with_data else None,
        )
        for pod, (sm, memory) in usage.items()
    ]
    whole = dataclasses.replace(alloc("GPU-x", "train", "t"), sharing="exclusive", process_sm=D("0.9"))
    return [
        gpu_hour(u, H100, allocations=allocations, hour=hour),
        gpu_hour("GPU-x", H100, allocations=[whole], hour=hour),
    ]


def test_a_report_shows_each_shared_pods_own_memory_and_utilization(ledger, tmp_path):
    prices = book(tmp_path, {"H100-80GB": {"hourly_rate": "6.88"}}, sharing_split="usage")
    # two hours with process data, a third without (it counts in cost, not in the own-use means)
    for i, with_data in enumerate((True, True, False)):
        hour = HOUR0 + timedelta(hours=i)
        gpu_hours = _hour(hour, with_data)
        lines = [line for gh in gpu_hours for line in price_gpu_hour(gh, prices).lines]
        ledger.write_hour(HourRecord(hour, gpu_hours, lines, prices), source="test")
    report = build_report(ledger, range_period(HOUR0, HOUR0 + timedelta(hours=3)), "namespace", compare=False)

    # by hand: etl-0 holds 30 GiB and 5 % in both hours with data, etl-1 20 GiB and 15 %
    own = {(p.namespace, p.pod): p.shared for p in report.shared_use}
    assert set(own) == {("data-eng", "etl-0"), ("data-eng", "etl-1")}  # the exclusive pod is not shared
    assert (own[("data-eng", "etl-0")].hours, own[("data-eng", "etl-0")].memory_bytes) == (2, D(30 * GIB))
    assert own[("data-eng", "etl-0")].sm == D("0.05") and own[("data-eng", "etl-1")].sm == D("0.15")

    table = html_tables(html_text(report))["shared-gpu-pods"]
    rows = {row[1]: row for row in table[1:]}
    assert rows["etl-0"][5:] == ["30.00", "5.0 %", "2"] and rows["etl-1"][5:] == ["20.00", "15.0 %", "2"]
    # under usage, etl-1 (15 %) pays three times etl-0 (5 %) in the hours with data: by hand, per hour
    # 0.5 × 15/20 × 6.88 = 2.58 and 0.5 × 5/20 × 6.88 = 0.86; the hour without is 0.25 × 6.88 = 1.72
    # each: etl-1 2 × 2.58 + 1.72 = 6.88, etl-0 2 × 0.86 + 1.72 = 3.44
    assert rows["etl-1"][3] == "6.88" and rows["etl-0"][3] == "3.44"
    pods = {p["pod"]: p for p in json.loads(json_text(report))["shared_gpu_pods"]}
    assert pods["etl-1"]["shared_gpu_use"] == {
        "hours_with_process_data": 2,
        "mean_memory_bytes": 20 * GIB,
        "mean_sm_utilization": 0.15,
    }


def test_the_json_lists_each_sharing_modes_pods_as_json_would_write_them(ledger, tmp_path):
    """The pods of each sharing mode are written apart from the rest of the JSON (a month of 10,000
    GPUs lists ~760,000): the bytes are `json.dumps`' of the whole document, whatever the names hold
    (quotes, backslashes, other scripts, the text that marks a list's place) and with a mode of none."""
    from gpumeter.reports.model import SharingRow
    from gpumeter.reports.render import _POD_LIST, report_dict

    prices = book(tmp_path, {"H100-80GB": {"hourly_rate": "6.88"}})
    gpu_hours = _hour(HOUR0, True)
    lines = [line for gh in gpu_hours for line in price_gpu_hour(gh, prices).lines]
    ledger.write_hour(HourRecord(HOUR0, gpu_hours, lines, prices), source="test")
    report = build_report(ledger, range_period(HOUR0, HOUR0 + timedelta(hours=1)), "namespace", compare=False)
    assert [m.sharing for m in report.sharing_modes] == ["exclusive", "time_slicing"]
    expected = json.dumps(report_dict(report), indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    assert json_text(report) == expected

    odd = [("data-eng", 'etl-"0"\\x'), ("données", "tâche-ü"), ("team", _POD_LIST.format(0))]
    report = dataclasses.replace(
        report,
        sharing_modes=[SharingRow("exclusive", []), SharingRow("mps", odd), *report.sharing_modes],
        groups=[dataclasses.replace(report.groups[0], key=_POD_LIST.format(1)), *report.groups[1:]],
    )
    expected = json.dumps(report_dict(report), indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    assert json_text(report) == expected
    assert json.loads(json_text(report))["sharing_modes"][1]["pods"][0] == {
        "namespace": "data-eng",
        "pod": 'etl-"0"\\x',
    }
