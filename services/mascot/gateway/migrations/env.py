"""Alembic environment: runs on the connection passed in ``config.attributes["connection"]``, or on
``sqlalchemy.url`` from the Alembic config / ``MASCOT_STORE__URL`` (the Helm pre-upgrade hook Job)."""

import os

from alembic import context
from sqlalchemy import create_engine

from mascot.gateway.store import Base

config = context.config
target_metadata = Base.metadata


def run() -> None:
    conn = config.attributes.get("connection")
    if conn is not None:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = config.get_main_option("sqlalchemy.url") or os.environ["MASCOT_STORE__URL"]
    engine = create_engine(url)
    with engine.begin() as c:
        context.configure(connection=c, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


run()
