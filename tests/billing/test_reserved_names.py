"""Names the reports write their own rows under cannot be a team's, a namespace's or a MIG profile's.

A team map naming a team `__total__` was accepted (the by-team CSV then had two `__total__` rows),
and an instance of a profile no H100 offers (`5g.99gb`) was billed with status ok as a profile of its
own, taking slices from the real ones in `--by mig_profile`. The map is now refused (exit 2, one
line naming the file, the entry and the name); the unknown profile's GPU-hour is unpriced, with a
warning saying which profile, and bills no team.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

import gpumeter
from gpumeter.billing.models import LineKind
from gpumeter.billing.pricer import Pricer
from tests.billing.factories import alloc, book, gpu_hour, mig

H100_SLICES = {"3g.40gb": (3, 4), "5g.99gb": (5, 8), "2g.20gb": (2, 2)}


@pytest.mark.parametrize(
    ("teams", "entry", "name"),
    [
        ("namespaces:\n  ml: __total__\n", "namespaces.ml", "__total__"),
        ("namespaces:\n  ml: __unallocated__\n", "namespaces.ml", "__unallocated__"),
        ("namespaces:\n  ml: __stranded__\n", "namespaces.ml", "__stranded__"),
        ("namespaces:\n  ml: __unpriced__\n", "namespaces.ml", "__unpriced__"),
        ("namespaces:\n  ml: __platform__\n", "namespaces.ml", "__platform__"),
        ("vms:\n  __total__: vision\n", "vms.__total__", "__total__"),
        ("vms:\n  vm-1: __platform__\n", "vms.vm-1", "__platform__"),
    ],
)
def test_a_team_map_naming_a_reserved_team_or_namespace_is_refused(tmp_path, capsys, teams, entry, name):
    path = tmp_path / "teams.yaml"
    path.write_text(teams)
    code = gpumeter.main(
        [
            "billing",
            "price",
            "--teams",
            str(path),
            "--from",
            "2026-11-01",
            "--to",
            "2026-11-02",
            "--db",
            f"sqlite:///{tmp_path / 'ledger.db'}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and str(path) in err and f"{entry}:" in err and f"(value {name!r})" in err, (
        err
    )


def test_a_namespace_named_total_is_refused_too_by_the_kubernetes_rule(tmp_path, capsys):
    path = tmp_path / "teams.yaml"
    path.write_text("namespaces:\n  __total__: vision\n")
    code = gpumeter.main(
        [
            "billing",
            "price",
            "--teams",
            str(path),
            "--from",
            "2026-11-01",
            "--to",
            "2026-11-02",
            "--db",
            f"sqlite:///{tmp_path / 'ledger.db'}",
        ]
    )
    assert code == 2 and "namespaces.__total__" in capsys.readouterr().err


def _h100_with_second_instance(profile: str):
    """An H100-80GB hour with two MIG instances held by namespaces ml and cv: 3g.40gb and ``profile``."""
    uuid = "GPU-h100"
    return gpu_hour(
        uuid,
        "H100-80GB",
        instances=[
            mig(uuid, "1", "3g.40gb", slices=H100_SLICES),
            mig(uuid, "2", profile, slices=H100_SLICES),
        ],
        allocations=[
            alloc(uuid, "ml", "a", gi="1", profile="3g.40gb"),
            alloc(uuid, "cv", "b", gi="2", profile=profile),
        ],
    )


def test_a_mig_profile_the_model_does_not_offer_is_unpriced_with_a_warning(tmp_path, caplog):
    prices = book(tmp_path, {"H100-80GB": {"hourly_rate": "7.00"}})
    strange = _h100_with_second_instance("5g.99gb")
    priced = Pricer(prices).price(strange, {"ml": "vision", "cv": "vision"})
    assert priced.device_cost is None
    assert [(line.kind, line.namespace, line.amount) for line in priced.lines] == [
        (LineKind.UNPRICED, "__unpriced__", None)
    ]
    assert any("MIG profile '5g.99gb' is not one H100-80GB offers" in w for w in priced.warnings)
    assert "5g.99gb" in caplog.text

    # the same GPU with profiles an H100 has: priced, $7.00 over its 3 + 2 of 7 compute slices and idle
    known = _h100_with_second_instance("2g.20gb")
    priced = Pricer(prices).price(known, {"ml": "vision", "cv": "vision"})
    assert priced.device_cost == Decimal("7.00") and not priced.warnings
    by_namespace = {line.namespace: line.amount for line in priced.lines if line.amount}
    assert by_namespace["ml"] == Decimal("3.00") and by_namespace["cv"] == Decimal("2.00")
