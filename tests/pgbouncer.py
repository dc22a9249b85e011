"""A real PgBouncer in transaction mode in front of the test server, for tests/test_pooler.py.

Debian's `pgbouncer` package (1.18, installed by .ci/run): its own port, a pool of 2 server
connections per database and user, trust authentication, and a config in a temporary directory
that the `postgres` user can read, as it runs as that user (it refuses to run as root).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

#: Server connections per database and user: fewer than the clients of the tests, as in
#: production, so that clients really share them.
POOL_SIZE = 2


@dataclass(frozen=True)
class PgBouncer:
    """A running PgBouncer: its port, and what it was started with."""

    port: int
    directory: Path
    process: subprocess.Popen[bytes]

    def url(self, settings: dict[str, Any]) -> str:
        """The URL of the database of a DATABASES entry `settings`, through this PgBouncer."""
        user = quote(settings["USER"] or "", safe="")
        password = f":{quote(settings['PASSWORD'], safe='')}" if settings["PASSWORD"] else ""
        return f"postgres://{user}{password}@127.0.0.1:{self.port}/{settings['NAME']}"

    def reconnect(self, settings: dict[str, Any]) -> None:
        """Close every server connection once released (the admin console's RECONNECT): what
        a test left on them goes with them."""
        admin = self.url({**settings, "NAME": "pgbouncer"})
        # The admin console speaks the simple query protocol only.
        with psycopg.connect(
            admin, autocommit=True, cursor_factory=psycopg.ClientCursor
        ) as console:
            console.execute("RECONNECT")


def binary() -> str | None:
    """Debian's pgbouncer, which lives in /usr/sbin (outside a user's PATH)."""
    return shutil.which("pgbouncer", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start(server: dict[str, Any]) -> Iterator[PgBouncer]:
    """Run PgBouncer in front of the server of DATABASES entry `server` until the generator
    is closed; skip the test without the binary."""
    program = binary()
    if program is None:
        pytest.skip("pgbouncer is not installed (Debian: apt-get install pgbouncer; .ci/run does)")
    directory = Path(tempfile.mkdtemp(prefix="switchboard-pgbouncer-"))
    port = free_port()
    user = server["USER"] or "postgres"
    password = server["PASSWORD"] or ""
    (directory / "users.txt").write_text(f'"{user}" "{password}"\n')
    (directory / "pgbouncer.ini").write_text(
        f"""[databases]
* = host={server["HOST"] or "127.0.0.1"} port={server["PORT"] or 5432}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {directory / "users.txt"}
admin_users = {user}
pool_mode = transaction
default_pool_size = {POOL_SIZE}
max_client_conn = 200
logfile = {directory / "pgbouncer.log"}
"""
    )
    command = [program, str(directory / "pgbouncer.ini")]
    if os.geteuid() == 0:  # it refuses root: run it as postgres, which must read and log here
        owner = pwd.getpwnam("postgres")
        for path in (directory, *directory.iterdir()):
            os.chown(path, owner.pw_uid, owner.pw_gid)
        command[1:1] = ["-u", "postgres"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bouncer = PgBouncer(port, directory, process)
    try:
        _wait_until_it_answers(bouncer, server)
        yield bouncer
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


def _wait_until_it_answers(bouncer: PgBouncer, server: dict[str, Any]) -> None:
    deadline = time.monotonic() + 15
    while True:
        try:
            psycopg.connect(bouncer.url(server), connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if bouncer.process.poll() is not None or time.monotonic() > deadline:
                bouncer.process.kill()
                log = bouncer.directory / "pgbouncer.log"
                told = log.read_text(errors="replace") if log.exists() else ""
                raise RuntimeError(f"pgbouncer did not start: {told}") from None
            time.sleep(0.05)
