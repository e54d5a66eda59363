"""A GPU-hour's MIG instances and allocations are stored as a shared layout plus the hour's readings.

`mig_instances` and `allocations` held one row per GPU-hour, instance and allocation: the ingest
bench wrote ~11,250 fact rows an hour for 1,000 GPUs, and writing them was the ingest's critical
path. Yet a GPU-hour's layout (its instances and holders, their slices, seconds and shares) is almost
always the previous hour's; only the readings (utilization, process use) change. So each distinct
layout is stored once in `gpu_layouts` (content-addressed by the SHA-256 of its canonical text) and
`gpu_hours` names it (`layout_id`) and carries the hour's readings as one small JSON text
(`readings`): one row per GPU-hour instead of one per GPU-hour, instance and allocation
(billing/ledger/layouts.py, docs/billing.md §6.1). A GPU-hour with neither instances nor
allocations (an idle whole GPU) names no layout: both columns stay NULL.

Existing facts are converted hour by hour, in the canonical order of `layouts.ordered`. Instance or
allocation rows without a `gpu_hours` row of their hour and GPU (which the ledger never wrote, and
could not read back) are dropped with a warning. The downgrade expands every layout and its readings
back into `mig_instances` and `allocations` rows, as they were at revision 0007.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from __future__ import annotations

import logging
from datetime import datetime

import sqlalchemy as sa
from alembic import op

from gpumeter.billing.ledger import layouts
from gpumeter.billing.ledger.types import Exact, UtcDateTime
from gpumeter.billing.models import Allocation, Device, GpuHour, MigInstance

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

log = logging.getLogger("alembic.runtime.migration")


def _instance_columns() -> list[sa.Column]:
    """`mig_instances` as it is at revision 0007 (0001, names made TEXT by 0004)."""
    return [
        sa.Column("hour", UtcDateTime(), primary_key=True),
        sa.Column("uuid", sa.Text(), primary_key=True),
        sa.Column("gpu_instance_id", sa.Text(), primary_key=True),
        sa.Column("mig_profile", sa.Text(), primary_key=True),
        sa.Column("compute_slices", sa.Integer(), nullable=False),
        sa.Column("memory_slices", sa.Integer(), nullable=False),
        sa.Column("present_seconds", sa.Integer(), nullable=False),
        sa.Column("utilization", Exact(12, 9), nullable=True),
    ]


def _allocation_columns() -> list[sa.Column]:
    """`allocations` as it is at revision 0007 (0001, names made TEXT by 0004, then 0005-0007)."""
    return [
        sa.Column("hour", UtcDateTime(), primary_key=True),
        sa.Column("uuid", sa.Text(), primary_key=True),
        sa.Column("gpu_instance_id", sa.Text(), primary_key=True),
        sa.Column("namespace", sa.Text(), primary_key=True),
        sa.Column("pod", sa.Text(), primary_key=True),
        sa.Column("container", sa.Text(), primary_key=True),
        sa.Column("resource", sa.Text(), primary_key=True),
        sa.Column("hostname", sa.Text(), nullable=False),
        sa.Column("mig_profile", sa.Text(), nullable=False),
        sa.Column("allocated_seconds", sa.Integer(), nullable=False),
        sa.Column("share", Exact(12, 9), nullable=False),
        sa.Column("utilization", Exact(12, 9), nullable=True),
        sa.Column("sharing", sa.String(16), nullable=False, server_default=""),
        sa.Column("memory_share", Exact(12, 9), nullable=True),
        sa.Column("compute_share", Exact(12, 9), nullable=True),
        sa.Column("process_sm", Exact(12, 9), nullable=True),
        sa.Column("process_memory", Exact(20, 0), nullable=True),
    ]


def _gpu_hours() -> sa.Table:
    """`gpu_hours` at this revision, typed (Exact gives Decimals, UtcDateTime aware datetimes)."""
    return sa.Table(
        "gpu_hours",
        sa.MetaData(),
        sa.Column("hour", UtcDateTime(), primary_key=True),
        sa.Column("uuid", sa.Text(), primary_key=True),
        sa.Column("hostname", sa.Text()),
        sa.Column("gpu", sa.Text()),
        sa.Column("model", sa.Text()),
        sa.Column("mig_mode", sa.Boolean()),
        sa.Column("present_seconds", sa.Integer()),
        sa.Column("utilization", Exact(12, 9)),
        sa.Column("layout_id", sa.Integer()),
        sa.Column("readings", sa.Text()),
    )


def _gpu_layouts() -> sa.Table:
    return sa.Table(
        "gpu_layouts",
        sa.MetaData(),
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("digest", sa.String(64)),
        sa.Column("body", sa.Text()),
        sa.Column("shared", sa.Boolean()),
    )


DEVICE = ("uuid", "model", "present_seconds", "hostname", "gpu", "mig_mode", "utilization")
INSTANCE = (
    "gpu_instance_id",
    "mig_profile",
    "compute_slices",
    "memory_slices",
    "present_seconds",
    "utilization",
)
ALLOCATION = tuple(c.name for c in _allocation_columns() if c.name not in ("hour", "uuid"))


def _hours(connection: sa.Connection, gpu_hours: sa.Table, where=None) -> list[datetime]:
    """The distinct hours of gpu_hours (a few thousand a year), oldest first."""
    query = sa.select(gpu_hours.c.hour).distinct().order_by(gpu_hours.c.hour)
    if where is not None:
        query = query.where(where)
    return list(connection.scalars(query))


def _orphans(connection: sa.Connection, table: str) -> int:
    """Rows of `table` with no gpu_hours row of their hour and GPU."""
    return connection.scalar(
        sa.text(
            f"SELECT count(*) FROM {table} AS t WHERE NOT EXISTS "  # a fixed table name
            "(SELECT 1 FROM gpu_hours AS g WHERE g.hour = t.hour AND g.uuid = t.uuid)"
        )
    )


def upgrade() -> None:
    op.create_table(
        "gpu_layouts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("shared", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.UniqueConstraint("digest", name="ux_gpu_layouts_digest"),
    )
    with op.batch_alter_table("gpu_hours") as batch:
        batch.add_column(sa.Column("layout_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("readings", sa.Text(), nullable=True))
        batch.create_foreign_key("fk_gpu_hours_layout_id", "gpu_layouts", ["layout_id"], ["id"])

    connection = op.get_bind()
    for table in ("mig_instances", "allocations"):
        orphans = _orphans(connection, table)
        if orphans:
            log.warning(
                "%s: %d row(s) have no gpu_hours row of their hour and GPU; they are dropped", table, orphans
            )

    gpu_hours, gpu_layouts = _gpu_hours(), _gpu_layouts()
    instances = sa.Table("mig_instances", sa.MetaData(), *_instance_columns())
    allocations = sa.Table("allocations", sa.MetaData(), *_allocation_columns())
    name_of = sa.update(gpu_hours).where(
        gpu_hours.c.hour == sa.bindparam("b_hour"), gpu_hours.c.uuid == sa.bindparam("b_uuid")
    )
    name_of = name_of.values(layout_id=sa.bindparam("b_layout"), readings=sa.bindparam("b_readings"))
    layout_ids: dict[str, int] = {}  # digest -> id of the layouts stored so far
    for hour in _hours(connection, gpu_hours):
        devices = connection.execute(
            sa.select(*(gpu_hours.c[name] for name in DEVICE)).where(gpu_hours.c.hour == hour)
        )
        facts = {row.uuid: GpuHour(hour, Device(*row)) for row in devices}
        for row in connection.execute(
            sa.select(instances.c.uuid, *(instances.c[name] for name in INSTANCE)).where(
                instances.c.hour == hour
            )
        ):
            if row.uuid in facts:
                facts[row.uuid].instances.append(MigInstance(*row))
        for row in connection.execute(
            sa.select(allocations.c.uuid, *(allocations.c[name] for name in ALLOCATION)).where(
                allocations.c.hour == hour
            )
        ):
            if row.uuid in facts:
                facts[row.uuid].allocations.append(Allocation(**row._mapping))
        named = []
        for uuid, gpu_hour in facts.items():
            ordered = layouts.ordered(gpu_hour)
            key = layouts.layout_key(*ordered)
            if key is None:
                continue
            body, digest, shared = layouts.layout_body(key)
            layout_id = layout_ids.get(digest)
            if layout_id is None:
                layout_id = layout_ids[digest] = connection.execute(
                    sa.insert(gpu_layouts)
                    .values(digest=digest, body=body, shared=shared)
                    .returning(gpu_layouts.c.id)
                ).scalar_one()
            named.append(
                {
                    "b_hour": hour,
                    "b_uuid": uuid,
                    "b_layout": layout_id,
                    "b_readings": layouts.readings(*ordered),
                }
            )
        if named:
            connection.execute(name_of, named)

    op.drop_table("allocations")
    op.drop_table("mig_instances")


def downgrade() -> None:
    instances = op.create_table("mig_instances", *_instance_columns())
    allocations = op.create_table("allocations", *_allocation_columns())

    connection = op.get_bind()
    gpu_hours, gpu_layouts = _gpu_hours(), _gpu_layouts()
    parsed: dict[int, dict] = {}  # layout id -> parsed body
    for hour in _hours(connection, gpu_hours, gpu_hours.c.layout_id.is_not(None)):
        rows = connection.execute(
            sa.select(
                *(gpu_hours.c[name] for name in DEVICE), gpu_hours.c.layout_id, gpu_hours.c.readings
            ).where(gpu_hours.c.hour == hour, gpu_hours.c.layout_id.is_not(None))
        )
        instance_rows, allocation_rows = [], []
        for *device, layout_id, readings in rows:
            layout = parsed.get(layout_id)
            if layout is None:
                body = connection.execute(
                    sa.select(gpu_layouts.c.body).where(gpu_layouts.c.id == layout_id)
                ).scalar_one()
                layout = parsed[layout_id] = layouts.parse_layout(body)
            gpu_hour = layouts.restore(hour, Device(*device), layout, readings)
            instance_rows += [
                {"hour": hour, "uuid": i.uuid, **{name: getattr(i, name) for name in INSTANCE}}
                for i in gpu_hour.instances
            ]
            allocation_rows += [
                {"hour": hour, "uuid": a.uuid, **{name: getattr(a, name) for name in ALLOCATION}}
                for a in gpu_hour.allocations
            ]
        for table, values in ((instances, instance_rows), (allocations, allocation_rows)):
            if values:
                connection.execute(sa.insert(table), values)

    with op.batch_alter_table("gpu_hours") as batch:
        batch.drop_constraint("fk_gpu_hours_layout_id", type_="foreignkey")
        batch.drop_column("readings")
        batch.drop_column("layout_id")
    op.drop_table("gpu_layouts")
