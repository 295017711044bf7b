"""Alembic environment: runs on the connection passed in ``config.attributes["connection"]``, or on
``sqlalchemy.url`` from the Alembic config / ``MASCOT_STORE__URL`` / the file named by ``MASCOT_STORE__URL_FILE``
(the Helm pre-upgrade hook Job)."""

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
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("MASCOT_STORE__URL", "")
    if not url and os.environ.get("MASCOT_STORE__URL_FILE"):  # the chart mounts the URL's Secret as a file
        with open(os.environ["MASCOT_STORE__URL_FILE"], encoding="utf-8") as f:
            url = f.read().strip()
    if not url:
        raise SystemExit("no database URL: set MASCOT_STORE__URL or MASCOT_STORE__URL_FILE (a file holding it)")
    engine = create_engine(url)
    with engine.begin() as c:
        context.configure(connection=c, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


run()
