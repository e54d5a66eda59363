"""Report files made as they are written: a month of 10,000 GPUs is ~1 million charges and a FOCUS
file of ~1.4 GB, so the charges are made from the report's columns a chunk at a time
(`reports.grouped.Charges`), the FOCUS rows a bucket at a time (`reports.focus.iter_rows`) and the
files written in parts (`reports.files.write_atomically`). What is written must be what the whole
text was, and a file whose parts fail half way must leave the old file as it was."""

from __future__ import annotations

import dataclasses
import hashlib
import re

import pandas as pd
import pytest

from gpumeter.reports import focus, grouped, render
from gpumeter.reports.files import ReportWriteError, write_atomically, write_files
from gpumeter.reports.model import build_report, month_period
from gpumeter.reports.period import utc_text

NOVEMBER = month_period("2026-11")


def test_a_file_written_in_parts_is_their_text_and_its_digest(tmp_path):
    parts = ["a,b\r\n", "1,é\r\n", "", "2,3\r\n"]
    checksums = write_files(tmp_path, {"whole.csv": "".join(parts), "parts.csv": lambda: iter(parts)})
    whole = "".join(parts).encode()
    assert (tmp_path / "parts.csv").read_bytes() == whole
    assert checksums == {"parts.csv": hashlib.sha256(whole).hexdigest()} | {
        "whole.csv": hashlib.sha256(whole).hexdigest()
    }


def test_parts_that_fail_half_way_leave_the_old_file_and_no_temporary_one(tmp_path):
    target = tmp_path / "lines.csv"
    target.write_bytes(b"last month's file\r\n")

    def parts():
        yield "a,b\r\n"
        raise OSError(28, "No space left on device")

    with pytest.raises(ReportWriteError, match=r"lines\.csv: cannot write the report file: \[Errno 28\]"):
        write_files(tmp_path, {"lines.csv": parts})
    assert target.read_bytes() == b"last month's file\r\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lines.csv"]

    def broken():
        yield b"a"
        raise ValueError("a renderer's bug")

    with pytest.raises(ValueError, match="renderer's bug"):
        write_atomically(target, broken())
    assert target.read_bytes() == b"last month's file\r\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lines.csv"]


def test_a_file_written_apart_is_put_in_place_in_its_turn_or_removed(tmp_path):
    """A file another process wrote to its temporary name (`WrittenApart`) is renamed into place with
    the digest that process gave, readable by others; where a file before it fails, it is removed
    with the rest unwritten; where waiting for it fails, it is removed and the error is the caller's."""
    from gpumeter.reports.files import WrittenApart, temporary_beside

    text = b"bucket,line\r\n"

    def apart(name: str) -> WrittenApart:
        temporary = temporary_beside(tmp_path / name)
        temporary.write_bytes(text)
        return WrittenApart(temporary, lambda: hashlib.sha256(text).hexdigest())

    checksums = write_files(tmp_path, {"summary.csv": "a\r\n", "lines.csv": apart("lines.csv")})
    assert checksums["lines.csv"] == hashlib.sha256(text).hexdigest()
    assert (tmp_path / "lines.csv").read_bytes() == text
    assert (tmp_path / "lines.csv").stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lines.csv", "summary.csv"]

    def full():
        yield "a,b\r\n"
        raise OSError(28, "No space left on device")

    with pytest.raises(ReportWriteError) as failed:
        write_files(tmp_path, {"focus.csv": full, "lines-2.csv": apart("lines-2.csv")})
    assert (failed.value.written, failed.value.unwritten) == ([], ["focus.csv", "lines-2.csv"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lines.csv", "summary.csv"]

    def died() -> str:
        raise RuntimeError("the report's line sums (process 1) ended without an answer, exit code -9")

    temporary = temporary_beside(tmp_path / "lines-3.csv")
    with pytest.raises(RuntimeError, match="ended without an answer"):
        write_files(tmp_path, {"lines-3.csv": WrittenApart(temporary, died)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lines.csv", "summary.csv"]


def test_charges_read_a_chunk_at_a_time_are_the_same_charges(worked_ledger, monkeypatch):
    report = build_report(worked_ledger, NOVEMBER, "team", grain="hour")
    charges = report.charges
    assert isinstance(charges, grouped.Charges)
    whole = list(charges)
    assert len(whole) == len(charges) > 7
    monkeypatch.setattr(grouped.Charges, "CHUNK", 3)  # chunks that cut buckets and origins
    assert list(charges) == whole
    assert [charges[i] for i in (0, 5, -1)] == [whole[0], whole[5], whole[-1]]
    assert charges[2:6] == whole[2:6]
    with pytest.raises(IndexError):
        charges[len(whole)]
    # the report's order: bucket first, so FOCUS can be made a bucket at a time
    assert [c.bucket for c in whole] == sorted(c.bucket for c in whole)


def test_focus_made_a_bucket_at_a_time_is_the_whole_report_s(worked_ledger, monkeypatch):
    report = build_report(worked_ledger, NOVEMBER, "team", grain="hour")
    rows = focus.rows(report)
    # every origin charge's rows still sum to the origin, bucket by bucket
    assert len(rows) == len(report.charges)
    monkeypatch.setattr(grouped.Charges, "CHUNK", 2)
    assert focus.rows(report) == rows
    text = render.focus_csv(report)
    assert "".join(render.focus_csv_parts(report)) == text
    assert text.count("\r\n") == len(rows) + 1


@pytest.mark.parametrize("version", focus.VERSIONS)
def test_focus_from_line_totals_is_focus_from_the_charges_columns(worked_ledger, version):
    """A report's charges set by hand as `LineTotal`s (a caller's, a test's) make the rows their
    columns make: the ledger's integers read back from the decimals, at day and at hour grain."""
    for grain in ("day", "hour"):
        report = build_report(worked_ledger, NOVEMBER, "team", grain=grain)
        rows = focus.rows(report, version=version)
        report.charges = list(report.charges)
        assert focus.rows(report, version=version) == rows
        assert len(rows) == len(report.charges)


def test_charges_out_of_bucket_order_are_refused_not_split_into_two_origins(worked_ledger):
    report = build_report(worked_ledger, NOVEMBER, "team", grain="hour")
    built = report.charges
    charges = list(built)
    first = charges[0].bucket
    later = [c for c in charges if c.bucket != first]
    # a charge of the first bucket again after the others: its origin would be cut in two
    report.charges = [*charges, dataclasses.replace(charges[0], pod="late")]
    assert later and later[-1].bucket > first
    with pytest.raises(
        ValueError, match=re.escape(f"not in bucket order (bucket {first.isoformat()} met twice)")
    ):
        focus.rows(report)
    report.charges = charges  # the same charges in order
    assert len(focus.rows(report)) == len(charges)
    # the same from the charges' columns: a row of the first bucket again at the end
    frame = pd.concat(list(built.chunks()), ignore_index=True)
    report.charges = grouped.Charges(
        pd.concat([frame, frame.iloc[[0]].assign(pod="late")], ignore_index=True)
    )
    with pytest.raises(ValueError, match=re.escape(f"(bucket {first.isoformat()} met twice)")):
        focus.rows(report)


def _lines_csv_from_line_totals(report) -> str:
    """The lines CSV as it was written before it was made from the charges' columns: a row per
    charge's `LineTotal`, each figure through `_qty`, `Report.money`, `Report.slices` and `_ratio`."""
    from gpumeter.billing.models import LineKind
    from gpumeter.reports import csvfile
    from gpumeter.reports.model import HOUR, version_label

    labels = {v.id: version_label(v) for v in report.price_versions}
    header = render.LINES_HEADER
    if report.has_clusters:
        header = [*header[:4], "cluster", *header[4:]]

    def ratio(weighted, quantity):
        return render._ratio(weighted / float(quantity) if quantity else None)

    rows = []
    for c in report.charges:
        row = [
            utc_text(c.bucket),
            utc_text(c.first_hour),
            utc_text(c.last_hour + HOUR),
            LineKind.UNPRICED.value if c.amount is None else c.kind,
            *(c.team, c.namespace, c.pod, c.container, c.model, c.mig_profile, c.uuid, c.gpu_instance_id),
            render._qty(c.quantity),
            render._qty(report.slices(c)),
            report.money(c.amount),
            c.currency,
            ratio(c.utilization_weighted, c.utilization_quantity),
            ratio(c.efficiency_weighted, c.efficiency_quantity),
            labels.get(c.price_version_id, ""),
            c.lines,
        ]
        if report.has_clusters:
            row.insert(4, c.cluster)
        rows.append(row)
    return csvfile.text(header, rows)


@pytest.mark.parametrize("grain", ["hour", "day"])
def test_the_lines_csv_made_from_columns_is_what_each_charge_says(worked_ledger, grain, monkeypatch):
    """The worked examples (ties, idle spread, stranded capacity) on every ledger, by hour and by day,
    in chunks that cut buckets: the text of each charge's `LineTotal` formatted in turn."""
    report = build_report(worked_ledger, NOVEMBER, "team", grain=grain)
    monkeypatch.setattr(grouped.Charges, "CHUNK", 3)
    assert "".join(render.lines_csv_parts(report)) == _lines_csv_from_line_totals(report)


def test_the_lines_csv_of_a_mixed_fleet_is_what_each_charge_says(tmp_path):
    """MIG slices held, an unpriced model, time-sliced replicas, over two days: the same."""
    from gpumeter.billing.ledger import open_ledger
    from gpumeter.billing.pricing import load_price_book
    from tests.billing.factories import write_book
    from tests.reports import synthetic

    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        synthetic.fill(ledger, load_price_book(write_book(tmp_path, synthetic.BOOK)), NOVEMBER.start, 2, 24)
        report = build_report(ledger, NOVEMBER, "team")
    finally:
        ledger.close()
    text = "".join(render.lines_csv_parts(report))
    assert ',"unpriced",' in text  # the unpriced model's lines
    assert any(report.slices(c) for c in report.charges)  # MIG slice-hours held
    assert text == _lines_csv_from_line_totals(report)
