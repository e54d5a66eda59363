"""A price book names models, never re-points the built-in NVML aliases, and prices with positive rates.

Each book below was accepted: an alias of the built-in table re-pointed (the H100's NVML name to
T4's rate took a day from $2,184.96 to $950.40, exit 0), a ``~`` key billed as a model named
"None", a rate of ``-0.0``. `gpumeter billing prices check` now refuses each in one line (exit 2),
naming the file, the field and the value.
"""

from __future__ import annotations

import textwrap

import pytest

import gpumeter
from tests.billing.factories import write_book

_TOP = "currency: USD\n"
_VERSION = "versions:\n- effective_from: 2026-01-01T00:00:00Z\n  gpus:\n"

REFUSED: dict[str, tuple[str, str, str]] = {
    "builtin-alias-re-pointed": (
        _TOP
        + "aliases:\n  NVIDIA H100 80GB HBM3: T4-16GB\n"
        + _VERSION
        + "    H100-80GB: {hourly_rate: 6.88}\n    T4-16GB: {hourly_rate: 0.35}\n",
        "aliases.NVIDIA H100 80GB HBM3",
        "'T4-16GB'",
    ),
    "builtin-alias-re-pointed-in-other-case": (
        _TOP
        + "aliases:\n  nvidia h100 80gb hbm3: T4-16GB\n"
        + _VERSION
        + "    H100-80GB: {hourly_rate: 6.88}\n    T4-16GB: {hourly_rate: 0.35}\n",
        "aliases.nvidia h100 80gb hbm3",
        "'T4-16GB'",
    ),
    "null-model-key": (
        _TOP + _VERSION + "    H100-80GB: {hourly_rate: 6.88}\n    ~: {hourly_rate: 1.00}\n",
        "versions[0].gpus.None",
        "None",
    ),
    "number-model-key": (
        _TOP + _VERSION + "    H100-80GB: {hourly_rate: 6.88}\n    100: {hourly_rate: 1.00}\n",
        "versions[0].gpus.100",
        "100",
    ),
    "rate-minus-zero": (
        _TOP + _VERSION + "    H100-80GB: {hourly_rate: -0.0}\n",
        "versions[0].gpus.H100-80GB.hourly_rate",
        "-0.0",
    ),
    "rate-zero": (
        _TOP + _VERSION + "    H100-80GB: {hourly_rate: 0}\n",
        "versions[0].gpus.H100-80GB.hourly_rate",
        "0",
    ),
    "seed-rate-minus-zero": (
        "gpuTypes:\n- name: t4-16gb\n  hourlyCost: -0.0\n",
        "gpuTypes[0].hourlyCost",
        "-0.0",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_book_naming_no_model_or_re_pointing_a_builtin_alias_is_refused(tmp_path, capsys, case):
    doc, field, value = REFUSED[case]
    path = write_book(tmp_path, doc)
    assert gpumeter.main(["billing", "prices", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line, no traceback
    assert str(path) in err and f": {field}: " in err and f"(value {value}" in err, err


def test_a_builtin_alias_named_to_its_own_model_and_new_aliases_are_accepted(tmp_path, capsys):
    path = write_book(
        tmp_path,
        textwrap.dedent(
            """\
            currency: USD
            aliases:
              NVIDIA H100 80GB HBM3: h100-80gb
              NVIDIA B200: B200-180GB
            versions:
            - effective_from: 2026-01-01T00:00:00Z
              gpus:
                H100-80GB: {hourly_rate: 6.88}
                B200-180GB: {hourly_rate: 9.50}
            """
        ),
    )
    assert gpumeter.main(["billing", "prices", "check", str(path)]) == 0, capsys.readouterr().err
