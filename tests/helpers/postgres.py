"""A throwaway PostgreSQL server for the store tests: initdb into a temporary folder, pg_ctl on a free loopback port."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import time

from tests.helpers.net import free_port
from tests.helpers.paths import need


def pg_binary(name: str) -> str:
    """The PostgreSQL server binary ``name`` (on PATH or Debian's /usr/lib/postgresql/*/bin); skips, or fails under
    CI, when it is missing."""
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))), None)
    need(found is not None, f"PostgreSQL server binary {name} not found (apt-get install postgresql)")
    return found


class PostgresServer:
    """A throwaway PostgreSQL server (initdb into a temp dir, pg_ctl, trust auth on 127.0.0.1:<free port>), run as an
    unprivileged user when the tests run as root. :meth:`restart` stops it (fast mode: sessions are cut) and starts
    it again on the same port and data, as a database restart in production would."""

    def __init__(self, base):
        self.initdb, self.pg_ctl = pg_binary("initdb"), pg_binary("pg_ctl")
        self.base, self.data = base, base / "data"
        self.as_user = []
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            os.chmod(base, 0o777)
            for p in [base, *base.parents][:-1]:
                os.chmod(p, os.stat(p).st_mode | 0o111)
            self.as_user = ["runuser", "-u", "nobody", "--"]
        self.port = free_port()
        subprocess.run([*self.as_user, self.initdb, "-D", str(self.data), "-U", "mascot", "--auth=trust"],
                       check=True, capture_output=True, timeout=120)
        self.url = f"postgresql+psycopg://mascot@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args, check=True):
        r = subprocess.run([*self.as_user, self.pg_ctl, "-D", str(self.data), *args], capture_output=True,
                           timeout=180)
        if check and r.returncode:
            log = (self.base / "log").read_text(errors="replace")[-2000:] if (self.base / "log").is_file() else ""
            raise AssertionError(f"pg_ctl {' '.join(args)} exited {r.returncode}: {r.stdout!r} {r.stderr!r}\n{log}")
        return r

    def start(self):
        """Start the server (waits until it accepts connections); its log goes to ``base``/log."""
        self._ctl("-l", str(self.base / "log"), "-w", "-o",
                  f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1", "start")

    def stop(self, check=True):
        """Stop the server (fast mode: sessions are cut); AssertionError when pg_ctl fails and ``check``."""
        self._ctl("-m", "fast", "-w", "-t", "150", "stop", check=check)

    def restart(self, down_s: float = 0.0):
        """Stop (every session cut), stay down ``down_s`` seconds, start again."""
        self.stop()
        time.sleep(down_s)
        self.start()
