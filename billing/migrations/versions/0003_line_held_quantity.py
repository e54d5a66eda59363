"""Cost lines carry the quantity held (slice-hours or GPU-hours) as pricing stated it.

Reports used to recover slice-hours by dividing the weighted quantity by a weight they worked out
again, which the `max` policy's normalisation made wrong. Lines written before this revision get
their GPU-hours (the weighted quantity) as a stand-in; re-price them (`gpumeter billing price`) to
store slice-hours for MIG lines.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

from gpumeter.billing.ledger.types import Exact

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("cost_lines") as batch:
        batch.add_column(sa.Column("held", Exact(18, 6), nullable=True))
        batch.add_column(sa.Column("held_unit", sa.String(16), nullable=True))
    op.execute("UPDATE cost_lines SET held = quantity, held_unit = 'gpu_hour'")
    with op.batch_alter_table("cost_lines") as batch:
        batch.alter_column("held", existing_type=Exact(18, 6), nullable=False)
        batch.alter_column("held_unit", existing_type=sa.String(16), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("cost_lines") as batch:
        batch.drop_column("held_unit")
        batch.drop_column("held")
