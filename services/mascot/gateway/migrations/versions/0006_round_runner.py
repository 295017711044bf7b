"""Rounds left running by a gateway process that is gone: which process runs a round (``runner``) and what closed an
interrupted one (``closed_by``: a newer message, a gateway restart, or a self-play stream that ended early).

Revision ID: 0006
Revises: 0005
"""
import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing rounds get no runner (""): on PostgreSQL a gateway never closes them at its start (a gateway of the
    # previous version may still be running them during a rolling upgrade); on SQLite every running one is closed.
    with op.batch_alter_table("rounds") as batch:
        batch.add_column(sa.Column("runner", sa.String(32), nullable=False, server_default=""))
        batch.add_column(sa.Column("closed_by", sa.String(16), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("rounds") as batch:
        batch.drop_column("closed_by")
        batch.drop_column("runner")
