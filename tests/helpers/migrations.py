"""The gateway store's Alembic migrations, run by hand."""

from __future__ import annotations

from alembic import command
from alembic.config import Config

from mascot.gateway.store import MIGRATIONS_DIR


def alembic(engine, action: str, revision: str) -> None:
    """Run Alembic ``action`` ("upgrade" / "downgrade") to ``revision`` on a SQLAlchemy ``engine``, in one
    transaction."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        getattr(command, action)(cfg, revision)
