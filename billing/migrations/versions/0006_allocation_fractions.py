"""Allocations keep a fractional grant's memory and compute fractions (HAMi, gpushare).

Re-pricing reads the facts back from the ledger, and the price version's slice_weight policy picks
between the two fractions (docs/billing.md §3.3), so both are stored. NULL for every other holding and
for rows from before this revision, which price by their share as before.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

from gpumeter.billing.ledger.types import Exact

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("allocations") as batch:
        batch.add_column(sa.Column("memory_share", Exact(12, 9), nullable=True))
        batch.add_column(sa.Column("compute_share", Exact(12, 9), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("allocations") as batch:
        batch.drop_column("compute_share")
        batch.drop_column("memory_share")
