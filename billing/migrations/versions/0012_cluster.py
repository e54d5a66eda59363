"""A GPU is (cluster, uuid): `gpu_hours.cluster` joins its key and `cost_line_terms.cluster` names
each line's cluster, for stores holding many clusters' series (docs/billing.md §2.3).

A global metrics store (VictoriaMetrics, Thanos, Mimir) labels every cluster's series with its
cluster (Prometheus `external_labels`), and two clusters may hold GPUs of one UUID, which the key
(hour, uuid) would have merged. `gpu_hours.cluster` is "" for a store without a cluster label (part
of the primary key, so never NULL); `cost_line_terms.cluster` is NULL for such lines, and a term
without a cluster keeps its digest (billing/ledger/terms.py), so existing ledgers keep their rows and
bill the same. The view `cost_lines` gains the column. The downgrade refuses a ledger whose hours
hold one UUID in two clusters (the old key cannot hold them), else drops the columns again.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpumeter.billing.ledger import terms
from gpumeter.billing.migrations import shapes

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def _primary_key(connection) -> str | None:
    return sa.inspect(connection).get_pk_constraint("gpu_hours").get("name")


def upgrade() -> None:
    connection = op.get_bind()
    dialect = connection.dialect.name
    if dialect == "sqlite":  # a primary key changes only with the table rebuilt
        op.add_column("gpu_hours", sa.Column("cluster", sa.Text(), nullable=False, server_default=""))
        # rebuilt as `shapes.gpu_hours_sqlite` says it now is: the column in the key
        with op.batch_alter_table(
            "gpu_hours", recreate="always", copy_from=shapes.gpu_hours_sqlite(cluster=True)
        ):
            pass
    else:
        name = _primary_key(connection) or "gpu_hours_pkey"
        op.add_column("gpu_hours", sa.Column("cluster", sa.Text(), nullable=False, server_default=""))
        op.drop_constraint(name, "gpu_hours", type_="primary")
        op.create_primary_key(name, "gpu_hours", ["hour", "cluster", "uuid"])
    op.execute("DROP VIEW cost_lines")
    op.add_column("cost_line_terms", sa.Column("cluster", sa.Text(), nullable=True))
    op.execute(terms.view(dialect, (*terms.COLUMNS_0011, "cluster")))


def downgrade() -> None:
    connection = op.get_bind()
    dialect = connection.dialect.name
    shared = connection.execute(
        sa.text("SELECT hour, uuid FROM gpu_hours GROUP BY hour, uuid HAVING COUNT(*) > 1 LIMIT 1")
    ).first()
    if shared is not None:
        raise RuntimeError(
            f"gpu_hours: uuid {shared.uuid} is in two clusters at {shared.hour}; revision 0011 cannot "
            "hold it (value cluster)"
        )
    op.execute("DROP VIEW cost_lines")
    with op.batch_alter_table("cost_line_terms") as batch:
        batch.drop_column("cluster")
    op.execute(terms.view(dialect, terms.COLUMNS_0011))
    if dialect == "sqlite":
        with op.batch_alter_table(
            "gpu_hours", recreate="always", copy_from=shapes.gpu_hours_sqlite(cluster=True)
        ) as batch:
            batch.drop_column("cluster")
    else:
        name = _primary_key(connection) or "gpu_hours_pkey"
        op.drop_constraint(name, "gpu_hours", type_="primary")
        op.drop_column("gpu_hours", "cluster")
        op.create_primary_key(name, "gpu_hours", ["hour", "uuid"])
