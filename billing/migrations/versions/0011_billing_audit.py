"""`billing_audit`: every change to an already-billed hour's amounts, with who, when, which book.

A re-price with a cheaper book took a day from $11,215.68 to $2,184.00 and left no trace (issue 42).
Re-ingest and re-price now write a row per hour whose total they change: the command and its run,
the operator and the reason given, the book's digest, and the hour's old and new totals
(docs/billing.md §6.6). Nothing existing changes; the downgrade drops the table.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpumeter.billing.ledger.types import Money, UtcDateTime

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "billing_audit",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", UtcDateTime(), nullable=False),
        sa.Column("run", sa.String(32), nullable=False),
        sa.Column("command", sa.String(16), nullable=False),
        sa.Column("operator", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("book_digest", sa.String(64), nullable=False),
        sa.Column("hour", UtcDateTime(), nullable=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("old_total", Money(), nullable=False),
        sa.Column("new_total", Money(), nullable=False),
    )
    op.create_index("ix_billing_audit_run", "billing_audit", ["run"])
    op.create_index("ix_billing_audit_hour", "billing_audit", ["hour"])


def downgrade() -> None:
    op.drop_index("ix_billing_audit_hour", table_name="billing_audit")
    op.drop_index("ix_billing_audit_run", table_name="billing_audit")
    op.drop_table("billing_audit")
