"""A cost line is unique per hour (natural key), and names are stored whatever their length.

* `cost_lines.line_key`: the digest of what identifies a line within its hour (uuid, kind,
  namespace, pod, container, GPU instance, profile; `billing.ledger.base.line_key`), unique with the
  hour. Two writers of one hour can then never both insert their lines, even past the per-hour lock.
  A ledger that already holds doubled hours (the concurrent-ingest bug this fixes) keeps the first
  copy of each line, the one with the lowest id; how many were dropped is logged per hour.
* Names (namespaces, pods, containers, teams, hostnames, models, sources, paths) become TEXT: a team
  or VM name longer than 255 characters used to fail the hour on PostgreSQL and block the range.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

import logging

import sqlalchemy as sa
from alembic import op

from gpumeter.billing.models import line_key_of

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

log = logging.getLogger("alembic.runtime.migration")

# (table, column, old type): every name-like column that had a length
NAMES: list[tuple[str, str, sa.types.TypeEngine]] = [
    ("ingest_runs", "source", sa.String(512)),
    ("price_book_versions", "path", sa.String(1024)),
    ("gpu_hours", "uuid", sa.String(128)),
    ("gpu_hours", "hostname", sa.String(255)),
    ("gpu_hours", "gpu", sa.String(16)),
    ("gpu_hours", "model", sa.String(128)),
    ("mig_instances", "uuid", sa.String(128)),
    ("mig_instances", "gpu_instance_id", sa.String(16)),
    ("mig_instances", "mig_profile", sa.String(64)),
    ("allocations", "uuid", sa.String(128)),
    ("allocations", "gpu_instance_id", sa.String(16)),
    ("allocations", "namespace", sa.String(255)),
    ("allocations", "pod", sa.String(255)),
    ("allocations", "container", sa.String(255)),
    ("allocations", "resource", sa.String(255)),
    ("allocations", "hostname", sa.String(255)),
    ("allocations", "mig_profile", sa.String(64)),
    ("namespace_teams", "namespace", sa.String(255)),
    ("namespace_teams", "team", sa.String(255)),
    ("cost_lines", "uuid", sa.String(128)),
    ("cost_lines", "namespace", sa.String(255)),
    ("cost_lines", "team", sa.String(255)),
    ("cost_lines", "pod", sa.String(255)),
    ("cost_lines", "container", sa.String(255)),
    ("cost_lines", "gpu_instance_id", sa.String(16)),
    ("cost_lines", "mig_profile", sa.String(64)),
    ("cost_lines", "model", sa.String(128)),
    ("billing_locks", "holder", sa.String(255)),
    ("report_runs", "grouping", sa.String(128)),
    ("report_runs", "out_dir", sa.String(1024)),
]
KEY_FIELDS = ("uuid", "kind", "namespace", "pod", "container", "gpu_instance_id", "mig_profile")


def _names_by_table() -> dict[str, list[tuple[str, sa.types.TypeEngine]]]:
    tables: dict[str, list[tuple[str, sa.types.TypeEngine]]] = {}
    for table, column, old in NAMES:
        tables.setdefault(table, []).append((column, old))
    return tables


def upgrade() -> None:
    for table, columns in _names_by_table().items():
        with op.batch_alter_table(table) as batch:
            for column, old in columns:
                batch.alter_column(column, existing_type=old, type_=sa.Text())

    with op.batch_alter_table("cost_lines") as batch:
        batch.add_column(sa.Column("line_key", sa.String(64), nullable=True))
    connection = op.get_bind()
    lines = sa.table(
        "cost_lines", sa.column("id"), sa.column("hour"), sa.column("line_key"), *map(sa.column, KEY_FIELDS)
    )
    seen: set[tuple] = set()
    doubled: dict[object, int] = {}
    keys, dropped = [], []
    for row in connection.execute(
        sa.select(lines.c.id, lines.c.hour, *(lines.c[f] for f in KEY_FIELDS)).order_by(lines.c.id)
    ):
        key = line_key_of(*row[2:])
        if (row.hour, key) in seen:
            dropped.append(row.id)
            doubled[row.hour] = doubled.get(row.hour, 0) + 1
        else:
            seen.add((row.hour, key))
            keys.append({"line_id": row.id, "key": key})
    for hour, count in sorted(doubled.items(), key=lambda item: str(item[0])):
        log.warning("cost_lines: hour %s held %d doubled line(s); the later copies are removed", hour, count)
    for start in range(0, len(dropped), 1000):
        connection.execute(sa.delete(lines).where(lines.c.id.in_(dropped[start : start + 1000])))
    if keys:
        connection.execute(
            sa.update(lines)
            .where(lines.c.id == sa.bindparam("line_id"))
            .values(line_key=sa.bindparam("key")),
            keys,
        )
    with op.batch_alter_table("cost_lines") as batch:
        batch.alter_column("line_key", existing_type=sa.String(64), nullable=False)
        batch.create_index("ux_cost_lines_hour_line_key", ["hour", "line_key"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("cost_lines") as batch:
        batch.drop_index("ux_cost_lines_hour_line_key")
        batch.drop_column("line_key")
    for table, columns in _names_by_table().items():
        with op.batch_alter_table(table) as batch:
            for column, old in columns:
                batch.alter_column(column, existing_type=sa.Text(), type_=old)
