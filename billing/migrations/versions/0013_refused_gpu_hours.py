"""`refused_gpu_hours`: the GPU-hours an ingest left unbilled because a reading of theirs was refused.

One GPU's NaN utilization for one hour refused that whole hour and stopped every later one: a week
of three fleets billed $4,278.88 of $13,109.76. Ingest now bills the rest of the hour and leaves out
only the GPU-hours with a refused reading, recording them here (replaced with the hour's facts on
each write, so the rows are the ones still outstanding), by (hour, cluster, uuid) as the ledger's
GPU-hours are since 0012, and the run as "partial", which catch-up retries. Nothing existing changes; the downgrade drops the table.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpumeter.billing.ledger.types import UtcDateTime

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "refused_gpu_hours",
        sa.Column("hour", UtcDateTime(), primary_key=True),
        sa.Column("cluster", sa.Text(), primary_key=True, server_default=""),  # "": the store has none
        sa.Column("uuid", sa.Text(), primary_key=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("refused_at", UtcDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("refused_gpu_hours")
