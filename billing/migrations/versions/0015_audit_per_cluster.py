"""`billing_audit.cluster`: an already-billed hour's change is recorded per cluster.

Revision 0011 recorded an hour's total over every cluster, so a re-ingest that moved money from one
cluster to another within an hour, the total unchanged, left no trace, and a `--cluster` report's
"changed after billing" showed every cluster's totals (docs/billing.md §2.3). Ingest and re-price now
write one row per cluster whose total they change, naming it ("" where the store has no cluster
label). The rows written before keep NULL: their totals are the hour's over every cluster, which
cannot be split after the fact. The downgrade drops the column; rows written per cluster then read as
they were written, one per cluster of an hour.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("billing_audit") as table:  # SQLite adds the column in place
        table.add_column(sa.Column("cluster", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("billing_audit") as table:  # SQLite 3.35+ drops it in place; else a copy
        table.drop_column("cluster")
