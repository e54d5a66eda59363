"""Initial ledger: facts, price-book versions, ingest runs, priced lines, locks.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op

from gpumeter.billing.ledger.types import Exact, Money, UtcDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ingest_runs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("hour", UtcDateTime(), nullable=False),
        sa.Column("started_at", UtcDateTime(), nullable=False),
        sa.Column("finished_at", UtcDateTime(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("source", sa.String(512), nullable=False),
    )
    op.create_index("ix_ingest_runs_hour", "ingest_runs", ["hour"])
    op.create_table(
        "price_book_versions",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("path", sa.String(1024), nullable=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("effective_from", UtcDateTime(), nullable=False),
        sa.Column("effective_to", UtcDateTime(), nullable=True),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
    )
    op.create_index(
        "ix_price_book_versions_digest_from", "price_book_versions", ["digest", "effective_from"], unique=True
    )
    op.create_table(
        "gpu_hours",
        sa.Column("hour", UtcDateTime(), primary_key=True),
        sa.Column("uuid", sa.String(128), primary_key=True),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("gpu", sa.String(16), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("mig_mode", sa.Boolean(), nullable=False),
        sa.Column("present_seconds", sa.Integer(), nullable=False),
        sa.Column("utilization", Exact(12, 9), nullable=True),
    )
    op.create_table(
        "mig_instances",
        sa.Column("hour", UtcDateTime(), primary_key=True),
        sa.Column("uuid", sa.String(128), primary_key=True),
        sa.Column("gpu_instance_id", sa.String(16), primary_key=True),
        sa.Column("mig_profile", sa.String(64), primary_key=True),
        sa.Column("compute_slices", sa.Integer(), nullable=False),
        sa.Column("memory_slices", sa.Integer(), nullable=False),
        sa.Column("present_seconds", sa.Integer(), nullable=False),
        sa.Column("utilization", Exact(12, 9), nullable=True),
    )
    op.create_table(
        "allocations",
        sa.Column("hour", UtcDateTime(), primary_key=True),
        sa.Column("uuid", sa.String(128), primary_key=True),
        sa.Column("gpu_instance_id", sa.String(16), primary_key=True),
        sa.Column("namespace", sa.String(255), primary_key=True),
        sa.Column("pod", sa.String(255), primary_key=True),
        sa.Column("container", sa.String(255), primary_key=True),
        sa.Column("resource", sa.String(255), primary_key=True),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("mig_profile", sa.String(64), nullable=False),
        sa.Column("allocated_seconds", sa.Integer(), nullable=False),
        sa.Column("share", Exact(12, 9), nullable=False),
        sa.Column("utilization", Exact(12, 9), nullable=True),
    )
    op.create_table(
        "namespace_teams",
        sa.Column("namespace", sa.String(255), primary_key=True),
        sa.Column("team", sa.String(255), nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
    )
    op.create_table(
        "cost_lines",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("hour", UtcDateTime(), nullable=False),
        sa.Column("uuid", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("namespace", sa.String(255), nullable=False),
        sa.Column("team", sa.String(255), nullable=False),
        sa.Column("pod", sa.String(255), nullable=False),
        sa.Column("container", sa.String(255), nullable=False),
        sa.Column("gpu_instance_id", sa.String(16), nullable=False),
        sa.Column("mig_profile", sa.String(64), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("quantity", Exact(18, 6), nullable=False),
        sa.Column("amount", Money(), nullable=True),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("price_version_id", sa.Integer(), sa.ForeignKey("price_book_versions.id"), nullable=True),
        sa.Column("efficiency", Exact(12, 9), nullable=True),
        sa.Column("utilization", Exact(12, 9), nullable=True),
    )
    op.create_index("ix_cost_lines_hour", "cost_lines", ["hour"])
    op.create_index("ix_cost_lines_namespace", "cost_lines", ["namespace"])
    op.create_table(
        "billing_locks",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
    )


def downgrade() -> None:
    for table in (
        "billing_locks",
        "cost_lines",
        "namespace_teams",
        "allocations",
        "mig_instances",
        "gpu_hours",
        "price_book_versions",
        "ingest_runs",
    ):
        op.drop_table(table)
