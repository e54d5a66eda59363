"""Price books bounded to what money can be (docs/billing.md §3.4): every number, every key, the file.

Each book below used to be accepted (and crashed or mis-priced later) or to hang the loader. Now
`gpumeter billing prices check` refuses each with exit 2, naming the file, the field and the value.
"""

from __future__ import annotations

import resource
import textwrap
import tracemalloc

import pytest

import gpumeter
from gpumeter.billing.config import ConfigError, load_team_map
from tests.billing.factories import write_book

V1 = {"effective_from": "2026-01-01T00:00:00Z"}


def _book(gpus: dict, **top) -> dict:
    return {"currency": "USD", **top, "versions": [{**V1, "gpus": gpus}]}


# an alias bomb of 460 bytes: nine levels of nine aliases each expand to 9^9 = 387 million strings
_BOMB = (
    "a: &a ["
    + ",".join(["lol"] * 9)
    + "]\n"
    + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8)
    )
)

BAD_BOOKS: dict[str, tuple[dict | str, str, str]] = {
    "rate-1e400": (
        _book({"H100-80GB": {"hourly_rate": "1E+400"}}),
        "versions[0].gpus.H100-80GB.hourly_rate",
        "'1E+400'",
    ),
    "rate-40-digits": (
        _book({"H100-80GB": {"hourly_rate": "1" * 40}}),
        "versions[0].gpus.H100-80GB.hourly_rate",
        "'" + "1" * 40 + "'",
    ),
    "rate-40-decimals": (
        _book({"H100-80GB": {"hourly_rate": "6." + "8" * 39}}),
        "versions[0].gpus.H100-80GB.hourly_rate",
        "'6.888",
    ),
    "rate-seven-decimals": (
        _book({"H100-80GB": {"hourly_rate": "6.8800001"}}),
        "versions[0].gpus.H100-80GB.hourly_rate",
        "'6.8800001'",
    ),
    "purchase-1e29": (
        _book({"A100-40GB": {"purchase_price": "1e29", "depreciation_months": 36}}),
        "versions[0].gpus.A100-40GB.purchase_price",
        "'1e29'",
    ),
    "depreciation-a-million-months": (
        _book({"A100-40GB": {"purchase_price": 15000, "depreciation_months": 1_000_000}}),
        "versions[0].gpus.A100-40GB.depreciation_months",
        "1000000",
    ),
    "derived-rate-too-large": (  # each input within its bound, the rate they derive is not
        _book({"A100-40GB": {"purchase_price": 10**12, "depreciation_months": 1}}),
        "versions[0].gpus.A100-40GB.purchase_price",
        "'1000000000000'",
    ),
    "seed-hourly-cost-1e400": (
        "gpuTypes:\n- name: t4-16gb\n  hourlyCost: 1E+400\n",
        "gpuTypes[0].hourlyCost",
        "'1E+400'",
    ),
    "duplicate-model": (
        textwrap.dedent(
            """\
            currency: USD
            versions:
            - effective_from: 2026-01-01T00:00:00Z
              gpus:
                H100-80GB: {hourly_rate: 6.88}
                H100-80GB: {hourly_rate: 0.01}
            """
        ),
        "versions[0].gpus.H100-80GB",
        "'H100-80GB'",
    ),
    "duplicate-model-across-case": (
        _book({"H100-80GB": {"hourly_rate": "6.88"}, "h100-80gb": {"hourly_rate": "0.01"}}),
        "versions[0].gpus.h100-80gb",
        "'h100-80gb'",
    ),
    "duplicate-currency": (
        "currency: USD\ncurrency: JPY\nversions:\n- effective_from: 2026-01-01\n  gpus: {H100-80GB: 6.88}\n",
        "currency",
        "'currency'",
    ),
    "duplicate-alias-across-case": (
        _book(
            {"H100-80GB": {"hourly_rate": "6.88"}, "A100-40GB": {"hourly_rate": "3.00"}},
            aliases={"NVIDIA X": "H100-80GB", "nvidia x": "A100-40GB"},
        ),
        "aliases.nvidia x",
        "'nvidia x'",
    ),
    "alias-to-unknown-model": (
        _book({"H100-80GB": {"hourly_rate": "6.88"}}, aliases={"NVIDIA H100 NVL": "H100-94GB"}),
        "aliases.NVIDIA H100 NVL",
        "'H100-94GB'",
    ),
    "configmap-data-mapping": (
        {"apiVersion": "v1", "kind": "ConfigMap", "data": {"cost-model.yaml": {"currency": "USD"}}},
        "data.cost-model.yaml",
        "{'currency': 'USD'}",
    ),
    "alias-bomb": (_BOMB, "(yaml)", "'*a'"),
    "anchors-in-a-configmap": (
        {"apiVersion": "v1", "kind": "ConfigMap", "data": {"cost-model.yaml": _BOMB}},
        "data.cost-model.yaml: (yaml)",
        "'*a'",
    ),
}


def test_the_bomb_is_small():
    assert len(_BOMB) <= 460


@pytest.mark.parametrize("case", sorted(BAD_BOOKS))
def test_book_beyond_what_money_can_be_is_refused(tmp_path, capsys, case):
    """Refused before it grew: the bomb took 1.15 GB (and 12 s). Measured in bytes allocated, which a
    loaded machine does not change, where a wall-clock bound failed under load."""
    doc, field, value = BAD_BOOKS[case]
    path = write_book(tmp_path, doc)
    tracemalloc.start()
    try:
        assert gpumeter.main(["billing", "prices", "check", str(path)]) == 2
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB allocated before the refusal"
    err = capsys.readouterr().err
    assert str(path) in err and f": {field}: " in err and f"(value {value}" in err, err
    assert "Traceback" not in err


def test_alias_bomb_is_refused_without_expanding_it(tmp_path, capsys):
    path = write_book(tmp_path, _BOMB)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert gpumeter.main(["billing", "prices", "check", str(path)]) == 2
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 50_000, f"peak memory grew {grown_kib} KiB"
    assert "aliases are not accepted" in capsys.readouterr().err


def test_a_file_over_one_mebibyte_is_refused(tmp_path, capsys):
    path = write_book(tmp_path, "currency: USD\n" + "# padding\n" * 110_000)
    assert gpumeter.main(["billing", "prices", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: (file): larger than 1048576 bytes" in err, err


def test_bounds_leave_real_books_alone(tmp_path, capsys):
    """The largest plausible inputs still load: a yen rate, a dinar rate with 3 decimals, an H100 at
    its list price over 60 months with power, PUE and overhead."""
    doc = {
        "currency": "JPY",
        "versions": [
            {
                **V1,
                "gpus": {
                    "H100-80GB": {"hourly_rate": 1200},
                    "A100-80GB": {
                        "purchase_price": 5_000_000,
                        "depreciation_months": 60,
                        "power_watts": 700,
                        "electricity_price_per_kwh": "31.5",
                        "pue": "1.4",
                        "overhead_per_hour": "12.123456",
                    },
                },
            }
        ],
    }
    assert gpumeter.main(["billing", "prices", "check", str(write_book(tmp_path, doc))]) == 0
    assert "OK, currency JPY" in capsys.readouterr().out


def test_team_map_with_a_namespace_twice_is_refused(tmp_path):
    path = tmp_path / "teams.yaml"
    path.write_text("namespaces:\n  research: ml\n  research: finance\n")
    with pytest.raises(ConfigError) as refused:
        load_team_map(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: namespaces.research: duplicate key") and "'research'" in message
