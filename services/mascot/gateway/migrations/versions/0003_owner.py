"""Security: the conversation's owner (the caller id that started it) and indexes for owner look-ups and the
retention sweep.

Revision ID: 0003
Revises: 0002
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing conversations get no owner (""): with caller tokens on, no caller sees them; they are still deleted
    # by the retention sweep and DeleteConversation with tokens off.
    with op.batch_alter_table("conversations") as batch:
        batch.add_column(sa.Column("owner", sa.String(64), nullable=False, server_default=""))
    op.create_index("ix_conversations_owner", "conversations", ["owner"])
    op.create_index("ix_conversations_created_at", "conversations", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_conversations_created_at", table_name="conversations")
    op.drop_index("ix_conversations_owner", table_name="conversations")
    with op.batch_alter_table("conversations") as batch:
        batch.drop_column("owner")
