"""`gpumeter report` names the value of a bad --format.

A finance analyst's probe: `--format xml` said what it expected but not what it was given, the one
flag error that did not."""

from __future__ import annotations

import pytest

from gpumeter import main


def test_a_bad_format_names_its_value(capsys):
    """`--format xml` (and `html,xml`): exit 2, the error names the flag and the value given."""
    for value in ("xml", "html,xml"):
        with pytest.raises(SystemExit) as exit_:
            main(["report", "--format", value])
        assert exit_.value.code == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert "--format" in last and f"(value {value!r})" in last, last
