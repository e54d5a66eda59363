"""Report runs: each rendered chargeback report with its period, price-book versions and file checksums.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op

from gpumeter.billing.ledger.types import UtcDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "report_runs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("period_start", UtcDateTime(), nullable=False),
        sa.Column("period_end", UtcDateTime(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("trigger", sa.String(16), nullable=False),
        sa.Column("grouping", sa.String(128), nullable=False),
        sa.Column("out_dir", sa.String(1024), nullable=False),
        sa.Column("price_book_versions", sa.Text(), nullable=False),
        sa.Column("ingest_runs", sa.Text(), nullable=False),
        sa.Column("files", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
    )
    op.create_index("ix_report_runs_period_start", "report_runs", ["period_start"])


def downgrade() -> None:
    op.drop_index("ix_report_runs_period_start", "report_runs")
    op.drop_table("report_runs")
