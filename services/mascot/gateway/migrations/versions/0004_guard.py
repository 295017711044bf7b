"""Reply checks: what the checks refused or cut, stored with the turn (and with the round when no turn followed).

Revision ID: 0004
Revises: 0003
"""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("turns") as batch:
        batch.add_column(sa.Column("guard", sa.JSON(), nullable=True))
    with op.batch_alter_table("rounds") as batch:
        batch.add_column(sa.Column("guard", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rounds") as batch:
        batch.drop_column("guard")
    with op.batch_alter_table("turns") as batch:
        batch.drop_column("guard")
