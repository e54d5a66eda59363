"""Billing applies ``max by (<the labels it keeps>)`` itself (billing/ingest/columns.py `_columns`, docs/billing.md
§2.2): it sends each query per series and reduces the answer. These tests hold the reduction against the
engines' own ``max by`` on a history whose series do need merging: an HA pair stored side by side in one
engine, each sample under its ``replica`` label, one replica missing half an hour and the other
scraping 7 s later (no de-duplication anywhere), besides the ``prometheus_replica`` pair the history already has.
"""

from __future__ import annotations

import math
import subprocess
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpumeter.billing import queries
from gpumeter.billing.ingest import KEEP, QUERIES, IngestConfig, ingest_hours
from gpumeter.billing.ingest.columns import _at, _columns, _in_order
from gpumeter.billing.ledger import MEMORY_URL, open_ledger
from gpumeter.billing.prom import PrometheusClient
from tests.billing import factories
from tests.billing.test_ingest_prometheus import (
    EXPECTED_BY_HOUR,
    EXPECTED_TOTAL,
    H0,
    _by_namespace,
    openmetrics,
)
from tests.support.servers import PrometheusServer, VictoriaMetricsServer, require_binary

HOURS = [H0 + timedelta(hours=i) for i in range(3)]
GAP = HOURS[1]  # replica r1 lost the second half of this hour


def _pair_in_one(text: str) -> str:
    """Each sample twice, under replica="r1" (none in the second half of GAP) and replica="r2" (7 s
    later), family by family. Prometheus lists r1 first: a reduction that kept the first series'
    value instead of the largest would bill half of GAP."""
    start, end = (GAP + timedelta(minutes=30)).timestamp(), (GAP + timedelta(hours=1)).timestamp()
    out = []
    for line in text.splitlines(keepends=True):
        if line.startswith("#"):
            out.append(line)
            continue
        head, _, stamp = line.rstrip("\n").rpartition(" ")
        series, _, value = head.rpartition(" ")
        if not start <= float(stamp) < end:
            out.append(f'{series[:-1]},replica="r1"}} {value} {stamp}\n')
        out.append(f'{series[:-1]},replica="r2"}} {value} {float(stamp) + 7:.0f}\n')
    return "".join(out)


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("prometheus", marks=pytest.mark.prometheus),
        pytest.param("victoriametrics", marks=pytest.mark.victoriametrics),
    ],
)
def engine(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    text = _pair_in_one(openmetrics())
    if request.param == "prometheus":
        source, data = root / "pair.om", root / "data"
        source.write_text(text if text.endswith("# EOF\n") else text + "# EOF\n")
        subprocess.run(
            [require_binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
            check=True,
            capture_output=True,
        )
        with PrometheusServer(root / "prom", data_dir=data) as server:
            yield server.url
    else:
        with VictoriaMetricsServer(root / "vm") as vm:
            vm.import_openmetrics(text.splitlines(keepends=True))
            yield vm.url


def _same(a: float | None, b: float | None) -> bool:
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_billings_max_by_is_the_engines(engine, name):
    first, last = _at(HOURS[0]), _at(HOURS[-1])
    with PrometheusClient(engine) as client:
        raw = client.query_range(QUERIES[name], first, last, 3600)
        theirs = client.query_range(queries.BILLING_QUERIES[name].aggregated(), first, last, 3600)
    ours = _in_order(_columns(raw, first.timestamp(), 3, KEEP[name]))
    theirs_columns = _columns(theirs, first.timestamp(), 3, KEEP[name])  # the engine's order kept
    assert [dict(labels) for labels, _ in ours] == [dict(labels) for labels, _ in theirs_columns]
    for (labels, values), (_, expected) in zip(ours, theirs_columns, strict=True):
        assert all(map(_same, values, expected)), (dict(labels), values, expected)
    if name in ("alloc_count", "gpu_count", "mig_count"):  # there was something to merge
        assert len(raw) >= 2 * len(ours) > 0


def test_the_pair_in_one_engine_bills_one_prometheus_ledger(engine, tmp_path):
    """Counts are never summed across replicas: the larger of each hour is billed, so the gap hour is
    the other replica's and every hour is the hand-computed one."""
    book = factories.book(
        tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}, "H100-80GB": {"hourly_rate": "6.88"}}
    )
    ledger = open_ledger(MEMORY_URL)
    with PrometheusClient(engine) as client:
        result = ingest_hours(client, ledger, book, HOURS, IngestConfig(scrape_interval=30))
    assert result.ingested == HOURS and result.failed == []
    assert _by_namespace(ledger.lines(H0, H0 + timedelta(hours=3))) == EXPECTED_TOTAL
    for i, expected in EXPECTED_BY_HOUR.items():
        hour = H0 + timedelta(hours=i)
        assert _by_namespace(ledger.lines(hour, hour + timedelta(hours=1))) == expected, i


def test_the_reduction_by_hand():
    """Series keyed on (z, a): merged hour by hour to the larger value (a NaN gives way to a number,
    as PromQL's ``max`` does), an empty label dropped as the engine drops it; `_in_order` then lists
    them in Prometheus' order of label sets (names, then values) whatever order the answer came in."""
    t0 = 1_000_000.0
    raw = [
        ({"a": "2", "b": "x", "z": "1"}, [[t0, "1"], [t0 + 3600, "NaN"]]),
        ({"a": "1", "b": "y", "z": "9"}, [[t0 + 7200, "5"]]),
        ({"a": "2", "b": "w", "z": "1"}, [[t0, "NaN"], [t0 + 3600, "2"], [t0 + 7200, "NaN"]]),
        ({"a": "3", "b": "v", "z": ""}, [[t0 + 0.0004, "4"]]),  # a time written otherwise: its hour
    ]
    out = _columns(raw, t0, 3, ("z", "a"))
    assert [dict(labels) for labels, _ in out] == [{"a": "2", "z": "1"}, {"a": "1", "z": "9"}, {"a": "3"}]
    merged = out[0][1]
    assert merged[:2] == [1.0, 2.0] and math.isnan(merged[2])
    assert out[1][1] == [None, None, 5.0] and out[2][1] == [4.0, None, None]
    ordered = _in_order(out)
    assert [dict(labels) for labels, _ in ordered] == [{"a": "1", "z": "9"}, {"a": "2", "z": "1"}, {"a": "3"}]


_TEXTS = ["0", "1", "4", "0.25", "NaN", "240", "+Inf"]


@given(
    series=st.lists(
        st.tuples(
            st.sampled_from([("1", "x"), ("1", "y"), ("2", "x")]),  # (z, b): z kept, so some series merge
            st.dictionaries(st.integers(0, 5), st.sampled_from(_TEXTS)),  # step -> the value's text
            st.booleans(),  # whether its times are written a little off the step (another engine)
        ),
        max_size=6,
    ),
    repeated=st.booleans(),
)
def test_columns_equal_the_answer_read_point_by_point(series, repeated):
    """`_columns` reads a series with a point at every step from its first to its last in one slice,
    and converts the values of `REPEATED` answers once per text: whatever the steps present (gaps,
    a late start, an early end) and the values (NaN, repeated texts), each hour holds what reading
    the points one by one gives, merged by PromQL's ``max``."""
    t0, count = 1_000_000.0, 6
    raw = [
        (
            {"z": z, "b": b},
            [[t0 + 3600 * step + (0.0004 if off else 0.0), text] for step, text in sorted(points.items())],
        )
        for (z, b), points, off in series
    ]
    expected: dict[str, list] = {}
    for (z, _), points, _ in series:
        values = expected.setdefault(z, [None] * count)
        for step, text in points.items():
            value, kept = float(text), values[step]
            values[step] = value if kept is None or kept < value or kept != kept else kept
    out = _columns(raw, t0, count, ("z",), repeated)
    assert [labels["z"] for labels, _ in out] == list(expected)
    for labels, values in out:
        assert [("nan" if v != v else v) for v in values] == [
            ("nan" if v is not None and v != v else v) for v in expected[labels["z"]]
        ]
