"""What one revision created that a later one reads or restores, kept in one place for both: the
migrations stay frozen at their revision, apart from the ORM (billing/ledger/orm.py), which follows head."""

from __future__ import annotations

import sqlalchemy as sa

from gpumeter.billing.ledger import terms
from gpumeter.billing.ledger.types import Exact, UtcDateTime


def cost_line_hours_0009() -> list[sa.Column]:
    """`cost_line_hours` as revision 0009 created it (0010 converts it, and restores it on downgrade)."""
    return [
        sa.Column("hour", UtcDateTime(), primary_key=True),
        sa.Column("line_key", sa.String(64), primary_key=True),
        sa.Column("term_id", sa.Integer(), sa.ForeignKey("cost_line_terms.id"), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("efficiency", Exact(12, 9), nullable=True),
        sa.Column("utilization", Exact(12, 9), nullable=True),
    ]


# the view `cost_lines` as revision 0009 created it (and 0010's downgrade restores it): the two tables joined
VIEW_0009 = (
    "CREATE VIEW cost_lines AS SELECT h.hour, h.seq, h.line_key, h.term_id, "
    + ", ".join(f"t.{name}" for name in terms.COLUMNS_0011[1:])
    + ", h.efficiency, h.utilization "
    "FROM cost_line_hours AS h JOIN cost_line_terms AS t ON t.id = h.term_id"
)


def gpu_hours_sqlite(*, cluster: bool, layout_key: bool = True) -> sa.Table:
    """`gpu_hours` as SQLite holds it from 0011 (``cluster``: with 0012's column, in the key;
    ``layout_key``: with the foreign key to `gpu_layouts` that 0014 drops): what a rebuild of the
    table makes (SQLite changes a key or a constraint only so), its primary key unnamed as 0001
    created it. Revisions 0012 and 0014 rebuild it so."""
    return sa.Table(
        "gpu_hours",
        sa.MetaData(),
        sa.Column("hour", UtcDateTime(), primary_key=True),
        sa.Column("uuid", sa.Text(), primary_key=True),
        sa.Column("hostname", sa.Text(), nullable=False),
        sa.Column("gpu", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("mig_mode", sa.Boolean(), nullable=False),
        sa.Column("present_seconds", sa.Integer(), nullable=False),
        sa.Column("utilization", Exact(12, 9), nullable=True),
        sa.Column("layout_id", sa.Integer(), nullable=True),
        sa.Column("readings", sa.Text(), nullable=True),
        *(
            [sa.ForeignKeyConstraint(["layout_id"], ["gpu_layouts.id"], name="fk_gpu_hours_layout_id")]
            if layout_key
            else []
        ),
        *([sa.Column("cluster", sa.Text(), primary_key=True, server_default="")] if cluster else []),
    )
