"""Small readers for rendered reports: HTML tables by id, CSV files as dicts."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from html.parser import HTMLParser
from pathlib import Path

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.models import Device, GpuHour
from tests.billing.factories import HOUR0, alloc, book


class _Tables(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, list[list[str]]] = {}
        self._stack: list[str | None] = []
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self._stack.append(attrs.get("id"))
            if attrs.get("id"):
                self.tables[attrs["id"]] = []
        elif tag == "tr" and self._stack and self._stack[-1]:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "table" and self._stack:
            self._stack.pop()
        elif tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables[self._stack[-1]].append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def html_tables(text: str) -> dict[str, list[list[str]]]:
    """Tables with an id attribute: rows of cell texts (header row included), entities decoded."""
    parser = _Tables()
    parser.feed(text)
    return parser.tables


def read_csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"), newline="")))


def two_hours(tmp_path, gpus: dict):
    """A SQLite ledger of hours 0 and 1 of whole GPUs at A100 rates: ``gpus`` is (cluster, uuid,
    model) -> {hour index: (namespace, pod) held} (the unpriced-totals and cluster-groups tests)."""
    prices = book(tmp_path, {"A100-40GB": "3.00"})
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    for h in range(2):
        hour = HOUR0 + timedelta(hours=h)
        hours = [
            GpuHour(
                hour,
                Device(uuid, model, 3600, f"node-{uuid}", "0", cluster=cluster),
                [],
                [alloc(uuid, *held[h])] if h in held else [],
            )
            for (cluster, uuid, model), held in gpus.items()
        ]
        lines = [line for gh in hours for line in price_gpu_hour(gh, prices, {}).lines]
        ledger.write_hour(HourRecord(hour, hours, lines, prices))
    return ledger
