"""Price books and team maps refuse what YAML 1.1 and Unicode let through (issue 42, point 9): a NUL
byte and deep nesting (tracebacks before: RecursionError), `1:30` read as 90 USD/h (sexagesimal) and
`0x10` as 16, and names a reader cannot tell from another: Cyrillic, fullwidth, zero-width and NBSP
twins of a model name or a team-map key. Each is one line naming the file, the field and the value,
and `gpumeter billing prices check` exits 2 with no traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpumeter import main
from gpumeter.billing.config import ConfigError, load_team_file
from gpumeter.billing.pricing import PriceBookError, load_price_book

BOOK = """currency: USD
versions:
  - effective_from: "2026-01-01T00:00:00Z"
    gpus:
      {model}: {{hourly_rate: {rate}}}
"""


def _book(tmp_path, model="H100-80GB", rate="6.88", raw: str | None = None):
    path = tmp_path / "prices.yaml"
    path.write_text(raw if raw is not None else BOOK.format(model=model, rate=rate), encoding="utf-8")
    return path


def _check(path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpumeter", "billing", "prices", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )


def test_the_plain_book_is_read(tmp_path):
    book = load_price_book(_book(tmp_path))
    assert str(book.versions[0].gpus["H100-80GB"].hourly_rate) == "6.88"


@pytest.mark.parametrize(
    ("rate", "shown"),
    [("1:30", "'1:30'"), ("0x10", "'0x10'"), ("0o17", "'0o17'"), ("0b11", "'0b11'")],
)
def test_yaml_1_1_numbers_are_text_and_refused(tmp_path, rate, shown):
    """Before: 1:30 priced the H100 at 90 USD/h, 0x10 at 16."""
    path = _book(tmp_path, rate=rate)
    with pytest.raises(PriceBookError) as refused:
        load_price_book(path)
    assert (
        str(refused.value) == f"{path}: versions[0].gpus.H100-80GB.hourly_rate: not a number (value {shown})"
    )


NAMES = [
    ("Н100-80GB", "mixes the scripts CYRILLIC, LATIN"),  # a Cyrillic EN
    ("Ｈ100-80GB", "not in Unicode NFKC form (it reads as 'H100-80GB')"),  # fullwidth
    ("H100\u200b-80GB", "holds the invisible or control character U+200B"),  # zero-width space
    ("H100\u00a080GB", "holds the invisible or control character U+00A0"),  # NBSP
    ("А100", "looks like the Latin name 'A100'"),  # Cyrillic A and digits: one script, a Latin twin
]


@pytest.mark.parametrize(("model", "problem"), NAMES)
def test_a_model_name_confusable_with_another_is_refused(tmp_path, capsys, model, problem):
    path = _book(tmp_path, model=f'"{model}"')
    with pytest.raises(PriceBookError, match=r"versions\[0\]\.gpus") as refused:
        load_price_book(path)
    assert problem in str(refused.value) and "\n" not in str(refused.value)
    assert "\u200b" not in str(refused.value).split("(value")[0]  # the field is shown escaped
    # the command's refusal in this process (the NUL and nesting tests below run it as a child)
    assert main(["billing", "prices", "check", str(path)]) == 2
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr and len(stderr.splitlines()) == 1, stderr


def test_a_twin_key_beside_the_real_one_is_refused(tmp_path):
    raw = BOOK.format(model="A100", rate="3.00") + '      "А100": {hourly_rate: 0.01}\n'
    path = _book(tmp_path, raw=raw)
    with pytest.raises(PriceBookError, match="looks like the Latin name 'A100'"):
        load_price_book(path)


@pytest.mark.spawns
def test_a_nul_byte_is_refused(tmp_path):
    raw = BOOK.format(model="H100-80GB", rate='"6.88\x00"')
    path = _book(tmp_path, raw=raw)
    done = _check(path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert (
        done.stderr.strip()
        == f"error: {path}: (file): a NUL character; not a text file (value 'offset {raw.index(chr(0))}')"
    )


@pytest.mark.spawns
def test_deep_nesting_is_refused(tmp_path):
    path = _book(tmp_path, raw="currency: USD\nversions: " + "[" * 5000 + "]" * 5000 + "\n")
    done = _check(path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "nested deeper than 16 levels" in done.stderr and len(done.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("tеam-a", "mixes the scripts CYRILLIC, LATIN"),  # a Cyrillic e
        ("team-a\u200b", "invisible or control character U+200B"),
        ("ｔeam-a", "not in Unicode NFKC form"),
        ("Team_A", "not a Kubernetes namespace name"),
        ("a" * 64, "not a Kubernetes namespace name"),
    ],
)
def test_a_team_map_key_must_be_a_plain_namespace_name(tmp_path, key, problem):
    path = tmp_path / "teams.yaml"
    path.write_text(f'namespaces:\n  "{key}": alpha\n  team-b: beta\n', encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load_team_file(path)
    assert problem in str(refused.value) and str(path) in str(refused.value)


def test_a_plain_team_map_is_read(tmp_path):
    path = tmp_path / "teams.yaml"
    path.write_text("namespaces:\n  team-a: alpha\n  ml-2: équipe\n", encoding="utf-8")
    assert load_team_file(path).namespaces == {"team-a": "alpha", "ml-2": "équipe"}
