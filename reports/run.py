"""Render a report end to end: read the ledger, write the files, record the run in the database."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gpumeter.billing.config import Budget
from gpumeter.billing.ledger.base import Ledger, ReportRunRecord
from gpumeter.billing.pricing.yamlload import YamlRefused, load_yaml
from gpumeter.process import give_back_memory, no_collections
from gpumeter.reports.files import ReportWriteError, write_atomically
from gpumeter.reports.model import Grouping, Period, Report, ReportError, build_report, version_label
from gpumeter.reports.render import FORMATS, RenderOptions, render
from gpumeter.reports.sums_worker import sums_apart

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"


@dataclass
class RunResult:
    report: Report
    out_dir: Path
    files: dict[str, str]  # name -> sha256
    run_id: int | None


def load_labels(path: str | Path | None) -> dict[str, dict[str, str]]:
    """``namespaces: {namespace: {label: value}}`` (namespace labels for ``--by label:KEY``)."""
    if not path:
        return {}
    path = Path(path)
    try:
        doc = load_yaml(path.read_bytes())
    except OSError as exc:
        raise ReportError(f"{path}: (file): cannot load labels: {exc.strerror or exc}") from None
    except YamlRefused as exc:  # the strict reader of every input file: field, value, what is wrong
        raise ReportError(f"{path}: {exc}") from None
    namespaces = doc.get("namespaces") if isinstance(doc, dict) else None
    if not isinstance(namespaces, dict) or not all(
        isinstance(v, dict) and all(isinstance(x, str) for x in v.values()) for v in namespaces.values()
    ):
        raise ReportError(f"{path}: namespaces: expected namespace: {{label: value}} (value {namespaces!r})")
    return {str(ns): {str(k): str(v) for k, v in labels.items()} for ns, labels in namespaces.items()}


def generate(
    ledger: Ledger,
    period: Period,
    grouping: Grouping | str,
    formats: tuple[str, ...],
    out_dir: str | Path,
    *,
    trigger: str = "cli",
    grain: str = "day",
    options: RenderOptions | None = None,
    now: datetime | None = None,
    record: bool = True,
    budgets: Mapping[str, Budget] | None = None,
    clusters: tuple[str, ...] = (),
    sums_process: bool | None = None,
) -> RunResult:
    """Build the report, write its files and a manifest, and record the run (period, price-book
    versions, ingest runs, checksums) in ``report_runs``. ``sums_process``: as `build_report`'s."""
    now = now or datetime.now(UTC)
    options = options or RenderOptions(generated_at=now)
    if isinstance(grouping, str):
        grouping = Grouping.parse(grouping)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ReportError(f"format: expected some of {', '.join(FORMATS)} (value {','.join(unknown)!r})")
    out = output_directory(out_dir)
    # the report's charges, frames and rows are freed by reference counting; the collector's passes
    # over them were 13 % of the 10,000-GPU report (docs/performance.md). Where the lines are summed
    # by a process of their own, it writes the lines CSV too, while this one writes FOCUS
    with (
        no_collections(),
        sums_apart(
            ledger,
            period,
            grain,
            period.previous(),
            sums_process,
            lines_file=out if "csv" in formats else None,
        ) as sums,
    ):
        report = build_report(
            ledger,
            period,
            grouping,
            grain=grain,
            top=options.top,
            budgets=budgets,
            # how shared GPU-hours were split and each GPU's node and presence: read from the facts for
            # FOCUS (origin charges, ResourceName, and 1.3's allocation columns)
            splits="focus" in formats,
            clusters=clusters,
            sums=sums,
            sums_process=sums is not None,  # decided above: None is summed here, not decided again
        )
        # the grouping's freed memory handed back (10,000 GPUs: ~300 MiB) before FOCUS is written
        # beside the worker's lines CSV
        give_back_memory()
        files = render(report, out, formats, options, lines_apart=sums.write_lines if sums else None)
    versions = [
        {"id": v.id, "label": version_label(v), "digest": v.digest, "path": v.path}
        for v in report.price_versions
    ]
    manifest = {
        "period": {"label": period.label, "start": period.start.isoformat(), "end": period.end.isoformat()},
        "group_by": grouping.name,
        "grain": grain,
        "generated_at": now.isoformat(),
        **({"clusters": list(clusters)} if clusters else {}),
        "trigger": trigger,
        "price_book_versions": versions,
        "ingest_runs": report.ingest.as_dict(),
        "files": files,
    }
    run_id = finish_run(
        ledger,
        out / MANIFEST,
        manifest,
        period=period,
        now=now,
        trigger=trigger,
        grouping=grouping.name,
        versions=versions,
        ingest_runs=report.ingest.as_dict(),
        record=record,
    )
    log.info("report %s by %s: %d file(s) in %s", period.label, grouping.name, len(files), out)
    return RunResult(report, out, files, run_id)


def output_directory(out_dir: str | Path) -> Path:
    """``out_dir``, created; before any work, since a file where the directory should be is the
    caller's mistake."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportError(
            f"out: not a directory that can be created or written ({exc.strerror}; value {str(out)!r})"
        ) from exc
    return out


def finish_run(
    ledger: Ledger,
    manifest_path: Path,
    manifest: dict,
    *,
    period: Period,
    now: datetime,
    trigger: str,
    grouping: str,
    versions: list[dict],
    ingest_runs: dict,
    record: bool,
) -> int | None:
    """Write a report's manifest, and record the run in ``report_runs`` (its id) when ``record``."""
    try:
        write_atomically(manifest_path, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
    except OSError as exc:  # the report's files are whole; the manifest naming them is not written
        raise ReportWriteError(manifest_path, exc, list(manifest["files"]), [manifest_path.name]) from None
    if not record:
        return None
    return ledger.record_report_run(
        ReportRunRecord(
            id=0,
            period_start=period.start,
            period_end=period.end,
            created_at=now,
            trigger=trigger,
            grouping=grouping,
            out_dir=str(manifest_path.parent.resolve()),
            price_book_versions=versions,
            ingest_runs=ingest_runs,
            files=manifest["files"],
            status="ok",
            error=None,
        )
    )
