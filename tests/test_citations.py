"""Code cites only files in the repository: the design and the facts it relies on live in docs/.

No file outside docs/ may cite the design notes or the reference folder the project was started from
(they are not in the repository), and every `docs/<file>.md §<section>` a file cites must exist.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.spawns  # `git ls-files` lists the repository's files
# Built from parts, so this file does not cite them itself.
OUTSIDE = re.compile(
    "|".join([r"\bDESIGN" + r"\.md\b", r"\breference" + r"/[\w.-]+\.(?:md|csv|tsv|proto)\b"])
)
# A citation of one of our docs; not a URL, and not another project's ("exporter-toolkit's docs/…").
CITATION = re.compile(r"(?<![/\w])(?<!'s )(?<!its )docs/([\w-]+\.md)\b(?:[,:]? ?§\s?(A?[\d.]*\d))?")


def repository_files() -> list[Path]:
    """Tracked files and new files git does not ignore (never .venv, build output or caches)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def text_of(path: Path) -> str | None:
    try:
        return path.read_text()
    except UnicodeDecodeError:  # images, archives
        return None


def sections(doc: Path) -> set[str]:
    """Section numbers of a doc's headings: "## 8. XID …" gives "8", "#### A.5.4 …" gives "A.5.4"."""
    found = set()
    for line in doc.read_text().splitlines():
        match = re.match(r"#+ (A\.)?(\d+(?:\.\d+)*)\.? ", line)
        if match:
            found.add((match.group(1) or "") + match.group(2))
        elif re.match(r"#+ A\. ", line):
            found.add("A")
    return found


@pytest.fixture(scope="module")
def files() -> list[Path]:
    return repository_files()


@pytest.mark.spawns
def test_nothing_outside_docs_cites_notes_that_are_not_in_the_repository(files):
    found = []
    for path in files:
        relative = path.relative_to(ROOT)
        if relative.parts[0] == "docs":
            continue
        text = text_of(path)
        for number, line in enumerate((text or "").splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert not found, "cite the file in docs/ that holds the fact instead:\n" + "\n".join(found)


def test_every_cited_doc_and_section_exists(files):
    known: dict[str, set[str]] = {}
    missing = []
    for path in files:
        if path.is_relative_to(ROOT / "tests" / "data"):  # other projects' files, citing their docs
            continue
        text = text_of(path)
        for number, line in enumerate((text or "").splitlines(), 1):
            for match in CITATION.finditer(line):
                doc, section = match.groups()
                target = ROOT / "docs" / doc
                where = f"{path.relative_to(ROOT)}:{number}"
                if not target.exists():
                    missing.append(f"{where}: docs/{doc} does not exist")
                elif section:
                    if doc not in known:
                        known[doc] = sections(target)
                    if section not in known[doc]:
                        missing.append(f"{where}: docs/{doc} has no section {section}")
    assert not missing, "\n".join(missing)


# A section cited by its title: a doc's path, then "Title" in quotes (comma optional). The title is a
# heading's text, its number left off ("## 7. Targets" is "Targets"), the text up to a colon, dash or
# parenthesis in it, or its first words ("Figures not re-measured" for "... on 2026-12-01").
TITLED = re.compile(r"(?<![/\w])(?<!'s )docs/([\w-]+\.md),? \"([^\"\n]{2,80})\"")
# A repository path named in a doc: `exporter/xid.py`, `deploy/kubernetes/base/` backticked, or a bare
# file name such as deploy/kubernetes/base/exporter-rbac.yaml, under one of the repository's top-level
# folders (globs and placeholders such as <part> are not paths).
TOP_LEVEL = ("exporter", "billing", "reports", "dashboards", "alerts", "deploy", "tests", "gpumeter", "docs")
_TOP = "(?:" + "|".join(TOP_LEVEL) + ")"
NAMED_PATH = re.compile(
    rf"`({_TOP}/[\w./-]*)`"  # backticked: a file or a folder
    rf"|(?<![\w/.-])(?<!'s )(?<!its )({_TOP}/[\w./-]*\.(?:py|md|yaml|yml|json|toml|proto|j2|sh|txt|csv|ini))\b"  # or a bare file
)


def titles(doc: Path) -> set[str]:
    """Each heading's title without its number, and its lead before a colon, dash or parenthesis."""
    found = set()
    for line in doc.read_text().splitlines():
        match = re.match(r"#+ (?:A?\.?[\d.]*\d\.? |A\. )?(.+?)\s*$", line)
        if match:
            title = match.group(1).replace("`", "")
            found |= {title, re.split(r"[:(—–;]| - ", title)[0].strip()}
    return found


def stale_titles(files: list[Path]) -> list[str]:
    known: dict[str, set[str]] = {}
    stale = []
    for path in files:
        if path.is_relative_to(ROOT / "tests" / "data"):
            continue
        for number, line in enumerate((text_of(path) or "").splitlines(), 1):
            for match in TITLED.finditer(line):
                doc, title = match.groups()
                target = ROOT / "docs" / doc
                if not target.exists():
                    continue  # test_every_cited_doc_and_section_exists names it
                if doc not in known:
                    known[doc] = titles(target)
                cited = title.replace("`", "")
                if cited not in known[doc] and not any(t.startswith(cited + " ") for t in known[doc]):
                    stale.append(f'{path.relative_to(ROOT)}:{number}: docs/{doc} has no section "{title}"')
    return stale


def test_every_section_cited_by_its_title_exists(files):
    stale = stale_titles(files)
    assert not stale, "\n".join(stale)


def test_a_stale_section_title_is_caught(tmp_path, monkeypatch):
    """The check above can fail: a cite of a heading that was renamed (the doc and the cites are built
    here from parts, so this file cites no doc that does not exist)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    doc = "docs/" + "x.md"
    (docs / "x.md").write_text(
        "# X\n\n## 7. Targets\n\n## Pools: GPU product\n\n## Figures not re-measured on 2026-12-01\n"
    )
    cites = tmp_path / "code.py"
    cites.write_text(
        f'# {doc}, "Targets"; {doc} "Pools"; {doc}, "Figures not re-measured"\n'
        f'# {doc}, "Issue 17, twelfth pass"\n'
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert stale_titles([cites]) == [f'code.py:2: {doc} has no section "Issue 17, twelfth pass"']


def _tail_of_a_path(named: str, files: list[Path]) -> bool:
    """A path named relative to a folder the text named just before it (`deploy/grafana/provisioning/`
    holds `dashboards/gpumeter.yaml`)."""
    tail = "/" + named.rstrip("/")
    return any(str(path).endswith(tail) or f"{tail}/" in str(path) for path in files)


def test_every_repository_path_a_doc_names_exists(files):
    missing = []
    for path in files:
        relative = path.relative_to(ROOT)
        if path.suffix != ".md" or relative.parts[0] == "tests":
            continue
        for number, line in enumerate((text_of(path) or "").splitlines(), 1):
            for named in (a or b for a, b in NAMED_PATH.findall(line)):
                if any(mark in named for mark in "*<>{}") or named.endswith("."):
                    continue
                if not (ROOT / named.rstrip("/")).exists() and not _tail_of_a_path(named, files):
                    missing.append(f"{relative}:{number}: {named} is not in the repository")
    assert not missing, "\n".join(missing)
