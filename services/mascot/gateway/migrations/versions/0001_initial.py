"""Initial schema: conversations, turns, rounds.

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("persona_ids", sa.JSON(), nullable=False),
        sa.Column("source_id", sa.String(256), nullable=False),
        sa.Column("context", sa.JSON(), nullable=False),
        sa.Column("adapter_versions", sa.JSON(), nullable=False),
        sa.Column("director_retries", sa.Integer(), nullable=False),
        sa.Column("director_fallbacks", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "turns",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("conversation_id", sa.String(64), sa.ForeignKey("conversations.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("round_key", sa.String(160), nullable=False),
        sa.Column("role", sa.String(8), nullable=False),
        sa.Column("persona_id", sa.String(64), nullable=False),
        sa.Column("directive", sa.JSON(), nullable=True),
        sa.Column("adapter_version", sa.String(128), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("think", sa.Text(), nullable=False),
        sa.Column("safety", sa.Boolean(), nullable=False),
        sa.Column("latency_s", sa.Float(), nullable=False),
        sa.Column("first_token_s", sa.Float(), nullable=False),
        sa.Column("director_s", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("conversation_id", "idx", name="uq_turn_position"),
    )
    op.create_index("ix_turns_conversation_id", "turns", ["conversation_id"])
    op.create_table(
        "rounds",
        sa.Column("conversation_id", sa.String(64), sa.ForeignKey("conversations.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("idempotency_key", sa.String(128), primary_key=True),
        sa.Column("text_sha256", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("user_turn_idx", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(32), nullable=False),
        sa.Column("agent_turns", sa.Integer(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("rounds")
    op.drop_index("ix_turns_conversation_id", table_name="turns")
    op.drop_table("turns")
    op.drop_table("conversations")
