"""`billing_audit.cluster` and `.team`: an already-billed hour's change is recorded per cluster and team.

Revision 0011 recorded an hour's total over every cluster and team, so a re-ingest or re-price that
moved money between them, the total unchanged, left no trace: a re-price with a team map that gave
a namespace a team moved 373.80 from "(no team)" to cv and `billing audit` said "no billed hour was
changed"; a re-ingest that moved money from one cluster to another likewise; and a `--cluster`
report's "changed after billing" showed every cluster's totals (docs/billing.md §2.3, §6.6). Ingest
and re-price now write one row per (cluster, team) whose total they change, naming both ("" where
the store has no cluster label, or the lines no team). The rows written before keep NULL in both:
their totals are the hour's over every cluster and team, which cannot be split after the fact. The
downgrade drops the columns; rows written since then read as one per cluster and team of an hour.

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
    with op.batch_alter_table("billing_audit") as table:  # SQLite adds the columns in place
        table.add_column(sa.Column("cluster", sa.Text(), nullable=True))
        table.add_column(sa.Column("team", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("billing_audit") as table:  # SQLite 3.35+ drops them in place; else a copy
        table.drop_column("team")
        table.drop_column("cluster")
