"""Safety gate: the conversation's safety flag and categories, and the safety_events table.

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing conversations start unflagged (server defaults fill the rows already there).
    with op.batch_alter_table("conversations") as batch:
        batch.add_column(sa.Column("safety_flagged", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("safety_categories", sa.JSON(), nullable=False, server_default=sa.text("'[]'")))
    op.create_table(
        "safety_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("conversation_id", sa.String(64), sa.ForeignKey("conversations.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("turn_idx", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("category", sa.String(32), nullable=False),
        sa.Column("rules", sa.String(256), nullable=False),
        sa.Column("detector", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_safety_events_conversation_id", "safety_events", ["conversation_id"])


def downgrade() -> None:
    op.drop_index("ix_safety_events_conversation_id", table_name="safety_events")
    op.drop_table("safety_events")
    with op.batch_alter_table("conversations") as batch:
        batch.drop_column("safety_categories")
        batch.drop_column("safety_flagged")
