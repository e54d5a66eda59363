"""Price books: native layout, derived rates, the seed-003 §6.1 layout, and bad books through the CLI
(each: the error names file, field and value; non-zero exit; the ledger database is not touched)."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from sqlalchemy import create_engine, inspect

import gpumeter
from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.pricing import PriceBookError, load_price_book
from gpumeter.billing.pricing.static import DEFAULT_BOOK
from tests.billing.factories import A100, HOUR0, alloc, gpu_hour, mig, write_book

D = Decimal

SEED_AS_WRITTEN = """\
version: v1
gpuTypes:
- name: a100-40gb
  hourlyCost: 3.50 # 美元/小时
  purchasePrice: 15000 # 美元
  powerConsumption: 300 # 瓦
  depreciation: 36 # 月
- name: v100-32gb
  hourlyCost: 2.00
  purchasePrice: 10000
  powerConsumption: 250
- name: t4-16gb
  hourlyCost: 0.50
  purchasePrice: 2000
  powerConsumption: 70
utilizationTiers:
- range: [0, 0.3]
  efficiency: 0.5 # 低利用率成本效率
- range: [0.3, 0.7]
  efficiency: 0.8
- range: [0.7, 1.0]
  efficiency: 1.0
sharingEfficiency:
  mig: 0.9
  vgpu: 0.85
  timeSharing: 0.75
"""


def test_default_book_has_the_reference_rates():
    book = load_price_book(DEFAULT_BOOK)
    rates = {m: p.hourly_rate for m, p in book.versions[0].gpus.items()}
    assert book.currency == "USD"
    assert {k: rates[k] for k in ("A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "L40S-48GB")} == {
        "A100-40GB": D("3.00"),
        "A100-80GB": D("3.50"),
        "H100-80GB": D("6.88"),
        "H200-141GB": D("7.50"),
        "L40S-48GB": D("1.50"),
    }
    assert rates["T4-16GB"] == D("0.45") and rates["V100-16GB"] == D("2.50")
    _, price = book.price(HOUR0, "NVIDIA H100 80GB HBM3")
    assert price.hourly_rate == D("6.88")


@pytest.mark.parametrize(
    ("nvml_name", "rate"),
    [
        # seed 003's older boards as the v100-t4 fleet's NVML names them (gpumeter/simulator/models.py)
        ("Tesla V100-PCIE-32GB", "2.00"),
        ("Tesla V100-SXM2-32GB", "2.00"),
        ("Tesla T4", "0.45"),
        # a guest's vGPU by its type's name, both spellings: the host rate x the framebuffer share
        ("GRID A100-4C", "0.30"),  # 3.00 x 4/40
        ("NVIDIA A100-4C", "0.30"),
        ("GRID A100-5C", "0.375"),  # 3.00 x 5/40
        ("GRID H100XM-20C", "1.72"),  # 6.88 x 20/80: what the host side bills an H100XM-20C (§8 (j), e = 1)
        ("NVIDIA H100XM-4C", "0.344"),  # 6.88 x 4/80
    ],
)
def test_default_book_prices_the_seed_gpus_and_guest_vgpus(nvml_name, rate):
    _, price = load_price_book(DEFAULT_BOOK).price(HOUR0, nvml_name)
    assert price is not None, f"{nvml_name} unpriced under the default book"
    assert price.hourly_rate == D(rate)


def test_derived_rate_from_tco_inputs(tmp_path):
    doc = {
        "currency": "EUR",
        "versions": [
            {
                "effective_from": "2026-01-01",
                "gpus": {
                    "A100-40GB": {
                        "purchase_price": 15000,
                        "depreciation_months": 36,
                        "power_watts": 300,
                        "electricity_price_per_kwh": "0.12",
                        "pue": "1.4",
                        "overhead_per_hour": "0.10",
                    }
                },
            }
        ],
    }
    price = load_price_book(write_book(tmp_path, doc)).versions[0].gpus["A100-40GB"]
    # 15000 / (36 x 730) = 0.570776255..; 0.3 kW x 1.4 x 0.12 = 0.0504; + 0.10 = 0.721176255.. -> 0.721176
    assert price.hourly_rate == D("0.721176") and price.derived


@pytest.mark.parametrize("wrapped", [False, True], ids=["document", "configmap"])
def test_seed_003_layout_as_written(tmp_path, wrapped):
    text = SEED_AS_WRITTEN
    if wrapped:
        text = (
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gpu-cost-model\n  namespace: kube-system\n"
            "data:\n  cost-model.yaml: |\n" + textwrap.indent(SEED_AS_WRITTEN, "    ")
        )
    book = load_price_book(write_book(tmp_path, text))
    (version,) = book.versions
    assert book.currency == "USD" and version.effective_from == datetime(1970, 1, 1, tzinfo=UTC)
    assert version.source == "seed-003 cost model v1"
    # name -> model key through the alias table; hourlyCost -> rate (it wins over the TCO inputs)
    assert book.price(HOUR0, "NVIDIA A100-SXM4-40GB")[1].hourly_rate == D("3.50")
    assert book.price(HOUR0, "Tesla V100-SXM2-32GB")[1].hourly_rate == D("2.00")
    assert book.price(HOUR0, "Tesla T4")[1].hourly_rate == D("0.50")
    # sharingEfficiency -> multipliers; timeSharing is our time_slicing
    assert version.sharing_efficiency == {"mig": D("0.9"), "vgpu": D("0.85"), "time_slicing": D("0.75")}
    # utilizationTiers -> report-only efficiency score, [lo, hi) with the last tier closed at 1.0
    assert [version.tier_efficiency(D(u)) for u in ("0", "0.29", "0.3", "0.69", "0.7", "1.0")] == [
        D("0.5"),
        D("0.5"),
        D("0.8"),
        D("0.8"),
        D("1.0"),
        D("1.0"),
    ]
    # and priced: a 7g.40gb held for the hour at 3.50 x mig 0.9 = 3.15 (+0.35 shortfall); util 0.2 -> 0.5
    u = "GPU-s"
    held = alloc(u, "ns", "p", gi="0", profile="7g.40gb")
    held = type(held)(**{**held.__dict__, "utilization": D("0.2")})
    priced = price_gpu_hour(gpu_hour(u, A100, [mig(u, "0", "7g.40gb")], [held]), book)
    tenant = next(line for line in priced.lines if line.namespace == "ns")
    assert (tenant.amount, tenant.efficiency) == (D("3.15"), D("0.5"))


def test_seed_layout_derives_a_rate_without_hourly_cost(tmp_path):
    text = (
        "gpuTypes:\n- name: a100-40gb\n  purchasePrice: 15000\n  powerConsumption: 300\n  depreciation: 36\n"
    )
    path = write_book(tmp_path, text + "electricityPrice: 0.10\n")
    # 15000 / 26280 = 0.570776.. + 0.3 x 0.10 = 0.600776..
    assert load_price_book(path).versions[0].gpus["A100-40GB"].hourly_rate == D("0.600776")
    with pytest.raises(PriceBookError, match=r"gpuTypes\[0\]\.electricityPrice: missing"):
        load_price_book(write_book(tmp_path, text, "no-electricity.yaml"))


V1 = {"effective_from": "2026-01-01T00:00:00Z", "gpus": {"H100-80GB": {"hourly_rate": "6.88"}}}
BAD_BOOKS = {
    "missing-rate": (
        {
            "currency": "USD",
            "versions": [{"effective_from": "2026-01-01", "gpus": {"H100-80GB": {"source": "x"}}}],
        },
        "versions[0].gpus.H100-80GB.hourly_rate",
        "None",
    ),
    "negative-price": (
        {"currency": "USD", "versions": [{**V1, "gpus": {"H100-80GB": {"hourly_rate": "-6.88"}}}]},
        "versions[0].gpus.H100-80GB.hourly_rate",
        "'-6.88'",
    ),
    "negative-purchase": (
        {
            "currency": "USD",
            "versions": [{**V1, "gpus": {"A100-40GB": {"purchase_price": -1, "depreciation_months": 36}}}],
        },
        "versions[0].gpus.A100-40GB.purchase_price",
        "-1",
    ),
    "unknown-currency": ({"currency": "USX", "versions": [V1]}, "currency", "'USX'"),
    "overlapping-versions": (
        {
            "currency": "USD",
            "versions": [
                {**V1, "effective_to": "2026-03-01T00:00:00Z"},
                {**V1, "effective_from": "2026-02-01T00:00:00Z"},
            ],
        },
        "versions[0].effective_to",
        "'2026-03-01T00:00:00+00:00'",
    ),
    "duplicate-versions": (
        {"currency": "USD", "versions": [V1, V1]},
        "versions[1].effective_from",
        "'2026-01-01",
    ),
    "efficiency-above-one": (
        {"currency": "USD", "versions": [{**V1, "sharing_efficiency": {"mig": "1.2"}}]},
        "versions[0].sharing_efficiency.mig",
        "'1.2'",
    ),
    "unknown-policy": (
        {"currency": "USD", "versions": [{**V1, "slice_weight": "sm"}]},
        "versions[0].slice_weight",
        "'sm'",
    ),
    "malformed-yaml": ("currency: USD\nversions: [\n  {effective_from: 2026-01-01\n", "(yaml)", "'line "),
    "seed-negative-hourly": (
        "gpuTypes:\n- name: t4-16gb\n  hourlyCost: -0.5\n",
        "gpuTypes[0].hourlyCost",
        "-0.5",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_BOOKS))
def test_bad_price_book_is_rejected_by_prices_check(tmp_path, capsys, case):
    doc, field, value = BAD_BOOKS[case]
    path = write_book(tmp_path, doc)
    assert gpumeter.main(["billing", "prices", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and f": {field}: " in err and f"(value {value}" in err, err


@pytest.mark.parametrize("case", ["missing-rate", "unknown-currency", "malformed-yaml"])
def test_bad_price_book_leaves_the_ledger_untouched(tmp_path, capsys, db, case):
    url, schema = db
    path = write_book(tmp_path, BAD_BOOKS[case][0])
    argv = ["billing", "ingest", "--prices", str(path), "--db", url, "--prometheus", "http://127.0.0.1:9"]
    if schema:
        argv += ["--db-schema", schema]
    assert gpumeter.main([*argv, "--no-progress"]) == 2
    assert str(path) in capsys.readouterr().err
    if url.startswith("sqlite"):
        assert not (tmp_path / "ledger.db").exists()
    else:
        engine = create_engine(url, connect_args={"options": f"-csearch_path={schema}"})
        assert inspect(engine).get_table_names(schema=schema) == []
        engine.dispose()


def test_prices_check_prints_rates(capsys):
    assert gpumeter.main(["billing", "prices", "check", str(DEFAULT_BOOK)]) == 0
    out = capsys.readouterr().out
    assert "OK, currency USD" in out and "H100-80GB    6.88 USD/h" in out
