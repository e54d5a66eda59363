"""Code cites only files in the repository: the design and the facts it relies on live in docs/.

No file outside docs/ may cite the design notes or the reference folder the project was started from
(they are not in the repository), and every `docs/<file>.md §<section>` a file cites must exist.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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
