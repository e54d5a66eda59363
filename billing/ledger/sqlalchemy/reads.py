"""What reports read, on SQL: facts, lines and their sums (summed in the database, exactly, at the
stored scales), the price versions and runs behind them, audit records and refused GPU-hours."""

from __future__ import annotations

import dataclasses
import itertools
import json
import operator
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import orjson
from sqlalchemy import BigInteger, Engine, Float, bindparam, case, cast, func, literal_column, select
from sqlalchemy.orm import Session

from gpumeter import contract
from gpumeter.billing.ledger import layouts
from gpumeter.billing.ledger.base import (
    BILLED_TO_TEAMS,
    AuditRecord,
    IngestRunRecord,
    LedgerSummary,
    LineTotal,
    PodHolding,
    PriceVersionRecord,
    RefusedGpuHour,
    ReportLedger,
    SharedUse,
    shared_use_of,
    summarise,
)
from gpumeter.billing.ledger.orm import (
    COST_LINES,
    BillingAudit,
    CostLineGroup,
    CostLineSet,
    CostLineSetTerm,
    CostLineTerm,
    GpuHourRow,
    GpuLayout,
    IngestRun,
    NamespaceTeam,
    PriceBookVersion,
    RefusedGpuHourRow,
)
from gpumeter.billing.ledger.sqlalchemy.store import LAYOUTS_KEPT, SqlStore, _stored
from gpumeter.billing.models import (
    HOUR,
    Device,
    GpuHour,
    Line,
    LineKind,
    QuantityUnit,
    cluster_namespace,
    day_windows,
    hours_between,
)
from gpumeter.billing.pricing.base import version_id
from gpumeter.process import usable_cpus

_HOUR = operator.itemgetter(0)


class SqlReads(SqlStore, ReportLedger):
    """`ReportLedger` on SQL: what the interface works out from lines and facts, answered in queries."""

    # cost_lines holds the Line record's fields, declared once in billing/models.py; the price version
    # is stored as its row in price_book_versions (tests/billing/test_ledger.py checks the ORM agrees).
    # A line is stored as its term (cost_line_terms, billing/ledger/terms.py), named by its GPU-hour's
    # set of terms (cost_line_sets), which the hour's line group names with the lines' readings.
    LINE_FIELDS = tuple(f.name for f in dataclasses.fields(Line))

    def __init__(self, engine: Engine, **kwargs: Any):
        super().__init__(engine, **kwargs)
        self._parsed_layouts: dict[int, dict] = {}  # id -> parsed body

    @_stored("read shared use")
    def shared_use(self, start: datetime, end: datetime) -> list[SharedUse]:
        """The shared layouts' GPU-hours a chunk of rows at a time through the driver (the hour as
        stored: it only tells the hours apart), none where no layout is shared. The shared layouts'
        ids are matched as a set (a join looked each GPU-hour's layout up in its table: 7.3 against
        2.1 s on SQLite for the 10,000-GPU bench month). Each hour's readings are parsed first; the
        layouts of those whose holders reported process memory are read a chunk at a time."""
        from gpumeter.billing.ledger import frames  # the bulk reader (pandas: a report's, which calls this)

        query = (
            "SELECT g.hour, g.cluster, g.layout_id, g.readings FROM gpu_hours AS g "
            "WHERE g.hour >= {mark} AND g.hour < {mark} AND g.readings IS NOT NULL "
            "AND g.layout_id IN (SELECT id FROM gpu_layouts WHERE shared)"
        )
        rows = []
        with Session(self.engine) as session:
            if session.scalar(select(GpuLayout.id).where(GpuLayout.shared).limit(1)) is None:
                return []  # no holder ever shared a GPU: nothing to scan the period for
            for part in frames._stream(self.engine, query, start, end, (), "gpumeter_shared_use"):
                measured = []
                for hour, cluster, layout_id, stored in part:
                    held = orjson.loads(stored)[1]  # per holder: [utilization, process SM, process memory]
                    if any(reading[2] is not None for reading in held):
                        measured.append((hour, cluster, layout_id, held))
                parsed = self._layouts(session, {layout_id for _, _, layout_id, _ in measured})
                rows.extend(
                    (cluster_namespace(cluster, namespace), pod, hour, memory, sm)
                    for hour, cluster, layout_id, held in measured
                    for namespace, pod, memory, sm in layouts.shared_holders(parsed[layout_id], held)
                )
        return shared_use_of(rows)

    def holdings(self, start: datetime, end: datetime) -> list[PodHolding]:
        """The range's distinct layouts, each parsed once: a month of a GPU is a handful of them."""
        query = (
            select(GpuHourRow.cluster, GpuHourRow.layout_id)
            .where(GpuHourRow.hour >= start, GpuHourRow.hour < end, GpuHourRow.layout_id.is_not(None))
            .distinct()
        )
        found: set[tuple[str, str, str, str]] = set()
        with Session(self.engine) as session:
            named = session.execute(query).all()
            parsed = self._layouts(session, {layout_id for _, layout_id in named})
            for cluster, layout_id in named:
                layout = parsed.get(layout_id)
                if layout is not None:
                    held = layouts.holdings_of(layout)
                    if cluster:  # as reports name the namespace (`cluster_namespace`)
                        held = {(cluster_namespace(cluster, h[0]), *h[1:]) for h in held}
                    found |= held
        return sorted(PodHolding(*h) for h in found)

    def _layouts(self, session: Session, ids: Iterable[int]) -> dict[int, dict]:
        """Stored layouts, parsed: those not kept read a few queries for any number
        (`layouts.stored_bodies`); a re-price of 10,000 GPUs names ~10,000 a day."""
        kept, ids = self._parsed_layouts, set(ids)
        found = {layout_id: kept[layout_id] for layout_id in ids if layout_id in kept}
        for layout_id, body in layouts.stored_bodies(session, ids - found.keys()).items():
            if len(kept) >= LAYOUTS_KEPT:
                kept.clear()
            found[layout_id] = kept[layout_id] = layouts.parse_layout(body)
        return found

    def facts(self, hour: datetime) -> list[GpuHour]:
        read, parsed = self._facts_rows(hour, hour + HOUR)
        return [
            layouts.restore(hour, Device(*device), None if layout_id is None else parsed[layout_id], stored)
            for _, rows in read
            for *device, layout_id, stored in rows
        ]

    FACTS_HOURS_READ = 24  # hours of facts one query of `facts_between` reads (~24,000 rows at 1,000 GPUs)

    def facts_between(self, start: datetime, end: datetime) -> Iterator[tuple[datetime, list[GpuHour]]]:
        """A day of hours' facts a query, each session closed before they are handed out (on SQLite a
        reader left open would hold off the re-price writing them). A GPU's GPU-hours of one layout are
        restored steady on the first (readings only, `layouts.restore_steady`), with the layout's
        key, as an ingest builds them: a re-price's pricer then finds them by that key."""
        # (cluster, uuid, layout id) -> (that GPU's first hour of it, the layout's key)
        templates: dict[tuple, tuple[GpuHour, tuple]] = {}
        keys: dict[int, tuple | None] = {}  # layout id -> its key, one object for every hour
        for at in range(0, len(every := hours_between(start, end)), self.FACTS_HOURS_READ):
            part = every[at : at + self.FACTS_HOURS_READ]
            read, layouts_read = self._facts_rows(part[0], part[-1] + HOUR)
            for hour, rows in read:
                facts = []
                for *device, layout_id, stored in rows:
                    device = Device(*device)
                    own = (device.cluster, device.uuid, layout_id)
                    steady = templates.get(own)
                    if steady is None and layout_id is not None:
                        # kept, never handed out: every hour of it, the first too, is restored steady
                        # on it, so a caller changing the facts it was given changes no other hour's
                        template = layouts.restore(hour, device, layouts_read[layout_id], stored)
                        if layout_id not in keys:
                            keys[layout_id] = layouts.layout_key(template.instances, template.allocations)
                        if (key := keys[layout_id]) is not None:
                            steady = templates[own] = (template, key)
                    if steady is None:  # an idle GPU: no layout
                        layout = None if layout_id is None else layouts_read[layout_id]
                        facts.append(layouts.restore(hour, device, layout, stored))
                    else:
                        facts.append(layouts.restore_steady(hour, device, steady[0], stored, steady[1]))
                if len(templates) > LAYOUTS_KEPT:
                    templates.clear()
                yield hour, facts

    @_stored("read facts")
    def _facts_rows(
        self, start: datetime, end: datetime
    ) -> tuple[list[tuple[datetime, list]], dict[int, dict]]:
        """(hour, its GPU-hour rows) of the hours in [start, end) with facts, read whole, and the
        layouts they name, parsed."""
        g = GpuHourRow
        with Session(self.engine) as session:
            rows = session.execute(
                select(g.hour, g.uuid, g.model, g.present_seconds, g.hostname, g.gpu, g.mig_mode)
                .add_columns(g.utilization, g.cluster, g.layout_id, g.readings)
                .where(g.hour >= start, g.hour < end)
                .order_by(g.hour, g.cluster, g.uuid)
            ).all()
            named = {row[-2] for row in rows} - {None}
            parsed = self._layouts(session, named)
        # one hour object per hour, which the pricer knows its price version by
        by_hour = [(hour, [row[1:] for row in group]) for hour, group in itertools.groupby(rows, key=_HOUR)]
        return by_hour, parsed

    @_stored("read lines")
    def lines(self, start: datetime, end: datetime) -> list[Line]:
        with Session(self.engine) as session:
            rows = session.execute(
                select(COST_LINES, PriceBookVersion.effective_from)
                .outerjoin(PriceBookVersion, COST_LINES.c.price_version_id == PriceBookVersion.id)
                .where(COST_LINES.c.hour >= start, COST_LINES.c.hour < end)
                .order_by(COST_LINES.c.hour, COST_LINES.c.seq)
            )
            read = {
                "kind": LineKind,
                "held_unit": QuantityUnit,
            }
            out = []
            for r in rows:
                fields = {name: getattr(r, name) for name in self.LINE_FIELDS if name != "price_version"}
                fields["cluster"] = fields["cluster"] or ""
                since = r.effective_from
                fields.update({name: to(fields[name]) for name, to in read.items()})
                out.append(Line(**fields, price_version=None if since is None else version_id(since)))
            return out

    @_stored("count rows")
    def counts(self) -> dict[str, int]:
        """Row counts per table (tests use it to prove nothing was written)."""
        tables = (
            BillingAudit,
            IngestRun,
            PriceBookVersion,
            GpuHourRow,
            GpuLayout,
            CostLineTerm,
            CostLineSet,
            NamespaceTeam,
            RefusedGpuHourRow,
        )
        # the view's lines: each group's set's terms. Counted through the view, every line's readings
        # were taken out of its JSON: 87 s for the 10,000-GPU bench ledger's two months
        sizes = (
            select(CostLineSetTerm.set_id, func.count().label("lines"))
            .group_by(CostLineSetTerm.set_id)
            .subquery()
        )
        lines = select(func.coalesce(func.sum(sizes.c.lines), 0)).join_from(
            CostLineGroup, sizes, sizes.c.set_id == CostLineGroup.set_id
        )
        with Session(self.engine) as session:
            counted = {t.__tablename__: session.scalar(select(func.count()).select_from(t)) for t in tables}
            counted["cost_lines"] = int(session.scalar(lines))
            return counted

    @_stored("summarise")
    def summary(self) -> LedgerSummary:
        with Session(self.engine) as session:
            query = select(
                COST_LINES.c.namespace,
                COST_LINES.c.team,
                COST_LINES.c.model,
                COST_LINES.c.mig_profile,
                COST_LINES.c.kind,
                COST_LINES.c.currency,
                COST_LINES.c.quantity,
                COST_LINES.c.amount,
                COST_LINES.c.cluster,
            )
            lines = [tuple(row) for row in session.execute(query)]
            last = session.scalar(
                select(func.max(IngestRun.hour)).where(IngestRun.status.in_(contract.INGEST_DONE))
            )
            counted = session.execute(select(IngestRun.status, func.count()).group_by(IngestRun.status))
            runs = {status: n for status, n in counted}
        return summarise(lines, last, runs)

    @_stored("read billed teams")
    def billed_teams(self, start: datetime, end: datetime) -> dict[datetime, dict[str, str]]:
        """A namespace whose lines have only ever been billed to one team (the ledger's terms say so
        in 0.8 s at 10,000 GPUs) is named with it in every hour of the range; only the hours of one
        billed to several teams, or to a team and to none, are read from the line groups, grouped in
        SQL per (hour, cluster, namespace): each set of terms' teams first, then the hour's groups.
        Read so for every namespace, the 10,000-GPU month took 23 s."""
        g, m, t = CostLineGroup, CostLineSetTerm, CostLineTerm
        cluster = func.coalesce(t.cluster, "")  # NULL: no cluster label, as ""
        with self.engine.connect() as conn:
            named = conn.execute(
                select(cluster, t.namespace, func.count(t.team.distinct()), func.max(t.team)).group_by(
                    cluster, t.namespace
                )
            ).all()
            steady = {cluster_namespace(c, ns): team for c, ns, teams, team in named if teams == 1 and team}
            moved = sorted({ns for _, ns, teams, _ in named if teams > 1})
            billed = {hour: steady for hour in hours_between(start, end)}
            if not moved:
                return billed
            of_set = (
                select(m.set_id, t.cluster, t.namespace, func.min(t.team).label("team"))
                .join(t, t.id == m.term_id)
                .where(t.team != "", t.namespace.in_(moved))
                .group_by(m.set_id, t.cluster, t.namespace)
                .subquery()
            )
            query = (
                select(g.hour, of_set.c.cluster, of_set.c.namespace, func.min(of_set.c.team))
                .join(of_set, of_set.c.set_id == g.set_id)
                .where(g.hour >= start, g.hour < end)
                .group_by(g.hour, of_set.c.cluster, of_set.c.namespace)
            )
            for hour, cluster, namespace, team in conn.execute(query):
                if billed[hour] is steady:
                    billed[hour] = dict(steady)
                billed[hour][cluster_namespace(cluster or "", namespace)] = team
        return billed

    @_stored("sum team costs")
    def team_costs(self, start: datetime, end: datetime) -> dict[tuple[str, str], Decimal]:
        """Summed in SQL as whole units of the stored scale (exact on SQLite's decimal text too)."""
        c = COST_LINES.c
        scale = 10**4  # Money() is NUMERIC(20, 4)
        query = (
            select(
                c.team,
                c.currency,
                func.sum(cast(func.round(c.amount * literal_column(str(scale))), BigInteger)),
            )
            .where(
                c.hour >= bindparam("lo", type_=c.hour.type),
                c.hour < bindparam("hi", type_=c.hour.type),
                c.kind.in_([kind.value for kind in BILLED_TO_TEAMS]),
                c.team != "",
                c.amount.isnot(None),
            )
            .group_by(c.team, c.currency)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(query, {"lo": start, "hi": end}).all()
        unit = Decimal(1).scaleb(-4)
        return {(team, currency): Decimal(int(total)) * unit for team, currency, total in rows}

    @_stored("sum lines")
    def line_totals(self, start: datetime, end: datetime, grain: str = "day") -> list[LineTotal]:
        """Lines summed in SQL per bucket; money and quantities summed exactly as integers of their
        stored scale (SQLite keeps exact decimal text, so no float ever carries an amount)."""
        table = COST_LINES
        c = table.c
        money_scale, qty_scale = 10**4, 10**6  # Money() is NUMERIC(20, 4), quantity NUMERIC(18, 6)
        sqlite = self.engine.dialect.name == "sqlite"
        if grain == "hour":
            bucket = c.hour
        elif grain == "day":
            bucket = func.substr(c.hour, 1, 10) if sqlite else func.date_trunc("day", c.hour)
        elif grain == "range":
            bucket = None
        else:
            raise ValueError(f"unknown grain {grain!r}")

        def scaled(column, scale):
            return cast(func.round(column * literal_column(str(scale))), BigInteger)

        keys = [
            c.kind,
            c.namespace,
            c.team,
            c.pod,
            c.container,
            c.uuid,
            c.gpu_instance_id,
            c.mig_profile,
            c.model,
            c.currency,
            c.price_version_id,
            c.held_unit,
            c.cluster,
        ]
        group = ([bucket] if bucket is not None else []) + keys
        query = (
            select(
                *group,
                func.min(c.hour),
                func.max(c.hour),
                func.count(),
                func.sum(scaled(c.quantity, qty_scale)),
                func.sum(scaled(c.amount, money_scale)),
                func.count(c.amount),
                cast(func.sum(c.utilization * c.quantity), Float),
                func.sum(case((c.utilization.isnot(None), scaled(c.quantity, qty_scale)), else_=None)),
                cast(func.sum(c.efficiency * c.quantity), Float),
                func.sum(case((c.efficiency.isnot(None), scaled(c.quantity, qty_scale)), else_=None)),
                func.sum(scaled(c.held, qty_scale)),
            )
            .where(c.hour >= bindparam("lo", type_=c.hour.type), c.hour < bindparam("hi", type_=c.hour.type))
            .group_by(*group)
        )
        qty_unit, money_unit = Decimal(1).scaleb(-6), Decimal(1).scaleb(-4)
        # Buckets never straddle a UTC day, so a long range is summed in day-aligned chunks on
        # parallel connections (the database works outside the GIL); results are simply concatenated.
        chunks = [(start, end)] if grain == "range" else day_windows(start, end, min(4, usable_cpus()))

        def fetch(window: tuple[datetime, datetime]) -> list:
            with self.engine.connect() as conn:
                return conn.execute(query, {"lo": window[0], "hi": window[1]}).all()

        if len(chunks) == 1:
            results = [fetch(chunks[0])]
        else:
            with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
                results = list(pool.map(fetch, chunks))
        out = []
        for row in (r for result in results for r in result):
            if bucket is None:
                when, rest = start, row
            else:
                when, rest = row[0], row[1:]
                if isinstance(when, str):
                    when = datetime.fromisoformat(when)
                if when.tzinfo is None:
                    when = when.replace(tzinfo=UTC)
            (kind, ns, team, pod, container, uuid, gi, profile, model, currency, version, unit) = rest[:12]
            cluster = rest[12] or ""
            (first, last, n, qty, amount, priced, u_w, u_q, e_w, e_q, held) = rest[13:]
            out.append(
                LineTotal(
                    bucket=when,
                    first_hour=first,
                    last_hour=last,
                    kind=kind,
                    namespace=ns,
                    team=team,
                    pod=pod,
                    container=container,
                    uuid=uuid,
                    gpu_instance_id=gi,
                    mig_profile=profile,
                    model=model,
                    currency=currency,
                    price_version_id=version,
                    lines=n,
                    quantity=Decimal(int(qty or 0)) * qty_unit,
                    amount=Decimal(int(amount)) * money_unit if priced else None,
                    utilization_weighted=float(u_w or 0.0),
                    utilization_quantity=Decimal(int(u_q or 0)) * qty_unit,
                    efficiency_weighted=float(e_w or 0.0),
                    efficiency_quantity=Decimal(int(e_q or 0)) * qty_unit,
                    held=Decimal(int(held or 0)) * qty_unit,
                    held_unit=unit,
                    cluster=cluster,
                )
            )
        return out

    @_stored("read lines")
    def line_frame(self, start: datetime, end: datetime, grain: str = "day"):
        """The lines of [start, end) as columns, summed in one query (billing/ledger/frames.py)."""
        from gpumeter.billing.ledger import frames  # pandas: loaded by reports only

        return frames.read_sql(self.engine, start, end, grain)

    @_stored("read price versions")
    def price_versions(self, ids: set[int]) -> dict[int, PriceVersionRecord]:
        if not ids:
            return {}
        with Session(self.engine) as session:
            rows = session.scalars(select(PriceBookVersion).where(PriceBookVersion.id.in_(sorted(ids))))
            return {
                r.id: PriceVersionRecord(
                    r.id,
                    r.digest,
                    r.path,
                    r.currency,
                    r.effective_from,
                    r.effective_to,
                    r.source,
                    json.loads(r.body),
                )
                for r in rows
            }

    @_stored("read refused GPU-hours")
    def refused_gpu_hours(
        self, start: datetime | None = None, end: datetime | None = None
    ) -> list[RefusedGpuHour]:
        query = select(
            RefusedGpuHourRow.hour,
            RefusedGpuHourRow.cluster,
            RefusedGpuHourRow.uuid,
            RefusedGpuHourRow.reason,
            RefusedGpuHourRow.refused_at,
        )
        if start is not None:
            query = query.where(RefusedGpuHourRow.hour >= start)
        if end is not None:
            query = query.where(RefusedGpuHourRow.hour < end)
        with Session(self.engine) as session:
            rows = session.execute(
                query.order_by(RefusedGpuHourRow.hour, RefusedGpuHourRow.cluster, RefusedGpuHourRow.uuid)
            )
            return [
                RefusedGpuHour(hour, cluster or None, uuid, why, at) for hour, cluster, uuid, why, at in rows
            ]

    @_stored("read ingest runs")
    def ingest_runs(self, start: datetime, end: datetime) -> list[IngestRunRecord]:
        with Session(self.engine) as session:
            rows = session.execute(
                select(
                    IngestRun.id,
                    IngestRun.hour,
                    IngestRun.started_at,
                    IngestRun.finished_at,
                    IngestRun.status,
                    IngestRun.source,
                )
                .where(IngestRun.hour >= start, IngestRun.hour < end)
                .order_by(IngestRun.hour, IngestRun.id)
            )
            return [IngestRunRecord(*row) for row in rows]

    @_stored("read audit records")
    def audit_records(self, start: datetime | None = None, end: datetime | None = None) -> list[AuditRecord]:
        a = BillingAudit
        query = select(
            a.id,
            a.at,
            a.run,
            a.command,
            a.operator,
            a.reason,
            a.book_digest,
            a.hour,
            a.currency,
            a.old_total,
            a.new_total,
            a.cluster,
            a.team,
        ).order_by(a.id)
        if start is not None:
            query = query.where(a.hour >= start)
        if end is not None:
            query = query.where(a.hour < end)
        with Session(self.engine) as session:
            return [AuditRecord(*row) for row in session.execute(query)]

    @_stored("read currencies")
    def currencies(self, start: datetime, end: datetime) -> set[str]:
        c = COST_LINES.c
        query = (
            select(c.currency)
            .where(
                c.hour >= bindparam("lo", type_=c.hour.type),
                c.hour < bindparam("hi", type_=c.hour.type),
                c.amount.isnot(None),
            )
            .distinct()
        )
        with self.engine.connect() as conn:
            return set(conn.execute(query, {"lo": start, "hi": end}).scalars())
