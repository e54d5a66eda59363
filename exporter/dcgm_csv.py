"""dcgm-exporter's collectors file (``-f/--collectors FILE``): which DCGM fields to export.

The format is dcgm-exporter's (``internal/pkg/counters/counter_config.go``, ``ReadCSVFile`` and
``ExtractCounters``): CSV, ``#`` starts a comment line, blank lines are skipped, every record has
exactly three fields ``DCGM field, Prometheus type, help``, each trimmed of spaces, and the type is
one of ``gauge``, ``counter``, ``histogram``, ``summary`` or ``label``. A ``label`` row makes the
field a label on every series (``DCGM_FI_DRIVER_VERSION``). dcgm-exporter uses the row's type and
help text in the exposition, so do we. A malformed file stops the start with one line naming the
file, the line and the value; a field we cannot export is not an error (dcgm-exporter skips fields
it cannot collect too): ``unexported()`` names them for one warning.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PROMETHEUS_TYPES", "CollectorsFile", "CollectorsFileError", "CsvField", "read_collectors"]

PROMETHEUS_TYPES = ("gauge", "counter", "histogram", "summary", "label")
MAX_BYTES = 1 << 20  # dcgm-exporter's files are a few KiB; a ConfigMap holds at most 1 MiB


class CollectorsFileError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class CsvField:
    name: str
    type: str
    help: str
    line: int


@dataclass(frozen=True, slots=True)
class CollectorsFile:
    path: str
    fields: tuple[CsvField, ...]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(f.name for f in self.fields if f.type != "label")

    @property
    def labels(self) -> frozenset[str]:
        return frozenset(f.name for f in self.fields if f.type == "label")

    def field(self, name: str) -> CsvField | None:
        for f in self.fields:
            if f.name == name:
                return f
        return None

    def unexported(
        self, exportable: frozenset[str] | set[str], labels: frozenset[str] | set[str]
    ) -> list[str]:
        """The listed fields this exporter has no source for, in file order."""
        return [
            f.name
            for f in self.fields
            if (f.type == "label" and f.name not in labels)
            or (f.type != "label" and f.name not in exportable)
        ]


def read_collectors(path: str) -> CollectorsFile:
    try:
        raw = Path(path).read_bytes()[: MAX_BYTES + 1]
    except OSError as exc:
        raise CollectorsFileError(f"{path}: cannot read collectors file: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise CollectorsFileError(f"{path}: collectors file larger than {MAX_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CollectorsFileError(f"{path}: not UTF-8 text (byte at offset {exc.start})") from None
    return parse_collectors(text, path)


def parse_collectors(text: str, path: str = "<collectors>") -> CollectorsFile:
    found: list[CsvField] = []
    seen: set[str] = set()
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            record = next(csv.reader(io.StringIO(line), skipinitialspace=True, strict=True))
        except csv.Error as exc:
            raise CollectorsFileError(f"{path}: line {number}: {exc} ({line!r:.80})") from None
        record = [value.strip(" ") for value in record]
        if len(record) != 3:
            raise CollectorsFileError(
                f"{path}: line {number}: expected 3 fields (DCGM field, type, help), got {len(record)} ({line!r:.80})"
            )
        name, kind, help_text = record
        if not name:
            raise CollectorsFileError(f"{path}: line {number}: empty DCGM field name ({line!r:.80})")
        if kind not in PROMETHEUS_TYPES:
            raise CollectorsFileError(
                f"{path}: line {number}: {name}: type must be one of {', '.join(PROMETHEUS_TYPES)} (got {kind!r:.40})"
            )
        if name in seen:
            continue  # listed twice: exported once, under the first row's type and help
        seen.add(name)
        found.append(CsvField(name, kind, help_text, number))
    if not found:
        raise CollectorsFileError(f"{path}: no fields listed (every line is blank or a comment)")
    return CollectorsFile(path, tuple(found))
