"""Allocations keep what their container's processes used (sharing_split: usage).

Re-pricing reads the facts back from the ledger, and a price version with ``sharing_split: usage``
splits a time-sliced or MPS GPU among its holders by their processes' SM time and memory
(docs/billing.md §3.5), so both are stored: the mean SM share of the GPU and the mean bytes of device
memory over the hour. NULL where the hour had no process data (and for rows from before this
revision), which prices the equal split as before.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

from gpumeter.billing.ledger.types import Exact

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("allocations") as batch:
        batch.add_column(sa.Column("process_sm", Exact(12, 9), nullable=True))
        batch.add_column(sa.Column("process_memory", Exact(20, 0), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("allocations") as batch:
        batch.drop_column("process_memory")
        batch.drop_column("process_sm")
