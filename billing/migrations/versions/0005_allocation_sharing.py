"""Allocations keep how they were shared (`sharing`: exclusive, mig, time_slicing, mps, ...).

Re-pricing reads the facts back from the ledger, so the sharing mode the exporter labelled must be
stored with them: an MPS replica is priced with `sharing_efficiency.mps`, not time-slicing's. Rows
from before this revision get "", which pricing reads the old way (a share below 1 or a `.shared`
resource is a time-sliced replica).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("allocations") as batch:
        batch.add_column(sa.Column("sharing", sa.String(16), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("allocations") as batch:
        batch.drop_column("sharing")
