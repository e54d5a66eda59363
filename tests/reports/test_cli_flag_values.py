"""`gpumeter report` refuses an empty FOCUS identity flag, and names the value of a bad --format.

A finance analyst's probe: `--account '' --service-name ''` wrote a FOCUS file that the project's own
checker (`reports.focus_check.check_file`) failed on every row (BillingAccountId, ServiceName ... must
not be null), with `InvoiceId` `'-2026-11` (the account, empty, then the period), and exited 0. And
`--format xml` said what it expected but not what it was given, the one flag error that did not."""

from __future__ import annotations

import pytest

from gpumeter import main
from gpumeter.billing.ledger import open_ledger


@pytest.fixture
def ledger_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    open_ledger(url).close()
    return url


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--account", ""),
        ("--account", "   "),
        ("--account", "\t"),
        ("--service-name", ""),
        ("--service-name", "  "),
    ],
    ids=["account-empty", "account-spaces", "account-tab", "service-empty", "service-spaces"],
)
def test_an_empty_focus_identity_flag_is_refused_before_anything_is_written(
    ledger_url, tmp_path, capsys, flag, value
):
    """Exit 2, one line naming the flag and the value as Python writes it (`''`, `'   '`), and no
    output directory: 0 files written (before: exit 0 and 5 files, FOCUS failing on every row)."""
    out = tmp_path / "out"
    code = main(
        [
            "report",
            "--db",
            ledger_url,
            "--period",
            "2026-11",
            "--format",
            "all",
            "--out",
            str(out),
            flag,
            value,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert flag in lines[0] and f"(value {value!r})" in lines[0], lines[0]
    assert not out.exists()


def test_both_empty_names_the_first(ledger_url, tmp_path, capsys):
    """`--account '' --service-name ''`, the probe's command: one line (not two), naming --account."""
    out = tmp_path / "out"
    argv = ["report", "--db", ledger_url, "--period", "2026-11", "--out", str(out)]
    assert main([*argv, "--account", "", "--service-name", ""]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--account" in line and "(value '')" in line
    assert not out.exists()


def test_a_named_account_still_writes(ledger_url, tmp_path, capsys):
    """A non-empty account and service, spaces inside, are kept as given: the report is written (1
    FOCUS file, its InvoiceId `finance ops-2026-11` would be the account then the period)."""
    out = tmp_path / "out"
    argv = ["report", "--db", ledger_url, "--period", "2026-11", "--format", "focus", "--out", str(out)]
    assert main([*argv, "--account", "finance ops", "--service-name", "GPU"]) == 0, capsys.readouterr().err
    assert [p.name for p in out.glob("*focus*")] == ["gpumeter-2026-11-focus-1.3.csv"]


def test_a_bad_format_names_its_value(capsys):
    """`--format xml` (and `html,xml`): exit 2, the error names the flag and the value given."""
    for value in ("xml", "html,xml"):
        with pytest.raises(SystemExit) as exit_:
            main(["report", "--format", value])
        assert exit_.value.code == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert "--format" in last and f"(value {value!r})" in last, last
