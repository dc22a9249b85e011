"""Which PostgreSQL the example project and the test suite use when DATABASE_URL is not set.

In order:

1. `DATABASE_URL`, when set: nothing is probed or printed.
2. The local server at `SWITCHBOARD_LOCAL_POSTGRES` (default 127.0.0.1:5432), when it accepts
   user `postgres` without a password; its database `switchboard` (or
   `SWITCHBOARD_DATABASE_NAME`: two checkouts, or CI's two legs, each with its own) is created
   if missing.
3. An embedded, throwaway PostgreSQL: the binaries of the `pgserver` wheel (or the system's
   `initdb`/`pg_ctl`, or `SWITCHBOARD_POSTGRES_BIN`), a fresh cluster in
   `.local/postgres-<pid>/`, listening on a free port of 127.0.0.1 only. (As root it runs as
   the `postgres` or `nobody` account; if that account cannot reach the project folder, the
   cluster goes in the temporary folder instead.)

The choice is exported as DATABASE_URL, so child processes (web server, workers, the tests'
subprocesses) share it, and said once on stderr by the process that made it.

The embedded server belongs to a keeper process (this module run as `keep`), started in its own
session so that a Ctrl-C in the terminal does not reach it. The keeper reads a pipe that only
the process which asked for the server holds: when that process exits, however it exits
(SIGKILL included), the pipe closes and the keeper stops the server and deletes its folder. A
clean exit also waits for that, so nothing is left running when `make test` returns. A keeper
killed outright leaves its server behind; the next keeper to start stops and deletes it.

    python -m devtools.database run -- COMMAND...

runs COMMAND with the database chosen once for it and all its children (the Makefile's `test`
and `demo`). This module is development tooling, not part of the reusable app or of the
example a project copies; it does not import Django, so the keeper starts quickly.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import psycopg
from psycopg import errors, sql

BASE_DIR = Path(__file__).resolve().parent.parent
PROJECT_DATABASE = "switchboard"
#: Names the project's database instead, on the local server or the embedded one.
DATABASE_NAME_VARIABLE = "SWITCHBOARD_DATABASE_NAME"
LOCAL_ADDRESS = "127.0.0.1:5432"
#: Passed to child processes beside DATABASE_URL: what was chosen, for them to report.
CHOICE_VARIABLE = "SWITCHBOARD_DATABASE_CHOICE"
#: Holds one `postgres-<keeper pid>` folder per embedded server; git-ignored.
EMBEDDED_ROOT = BASE_DIR / ".local"
#: Where they go instead when the account PostgreSQL runs as cannot reach the project folder.
FALLBACK_ROOT = Path(tempfile.gettempdir(), f"switchboard-postgres-{os.getuid()}")
#: PostgreSQL refuses to run as root; as root, the embedded server runs as the first of these.
UNPRIVILEGED_USERS = ("postgres", "nobody")
#: A throwaway cluster needs no durability: skipping fsync makes the test suite faster.
EMBEDDED_CONFIG = """
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
fsync = off
synchronous_commit = off
full_page_writes = off
"""

#: The keeper of this process's embedded server; kept referenced, as dropping it closes the pipe.
_keeper: subprocess.Popen[str] | None = None


class NoDatabase(RuntimeError):
    """No PostgreSQL could be found or started."""


def ensure_database_url(database: str | None = None) -> str:
    """Return DATABASE_URL; when it is unset, choose a server, export its URL and say which.

    The database is `database`, else SWITCHBOARD_DATABASE_NAME, else `switchboard`."""
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    database = database or os.environ.get(DATABASE_NAME_VARIABLE) or PROJECT_DATABASE
    address = os.environ.get("SWITCHBOARD_LOCAL_POSTGRES") or LOCAL_ADDRESS
    host, port = _split_address(address)
    try:
        _ensure_database(host, port, database)
    except psycopg.Error as error:
        # psycopg says 'connection failed: connection to server at ... failed: <the reason>'.
        reason = _first_line(error).rsplit("failed: ", 1)[-1]
        unusable = f"nothing usable at {address} ({reason})"
        url, where = _start_embedded(database, unusable)
        choice = f"{where}; {unusable}"
    else:
        url = f"postgres://postgres@{_url_host(host)}:{port}/{database}"
        choice = f"the local PostgreSQL at {address}, database {database!r}"
    _say(choice)
    os.environ["DATABASE_URL"] = url
    os.environ[CHOICE_VARIABLE] = f"{url} {choice}"
    return url


def chosen() -> str | None:
    """What this process or a parent chose when DATABASE_URL was not set, in words.

    None when DATABASE_URL no longer holds the URL chosen (a child given another database).
    """
    url, _, choice = os.environ.get(CHOICE_VARIABLE, "").partition(" ")
    return choice if choice and url == os.environ.get("DATABASE_URL") else None


def _say(message: str) -> None:
    print(f"switchboard: database: {message}", file=sys.stderr, flush=True)


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise NoDatabase(f"SWITCHBOARD_LOCAL_POSTGRES must be host:port, not {address!r}.")
    return host.strip("[]"), int(port)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _ensure_database(host: str, port: int, database: str) -> int:
    """Connect as `postgres`, create `database` if missing; return the server version number."""
    with psycopg.connect(
        host=host, port=port, user="postgres", dbname="postgres", connect_timeout=3, autocommit=True
    ) as connection:
        found = connection.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [database]
        ).fetchone()
        if found is None:
            # Another process probing at the same time may create it first.
            with contextlib.suppress(errors.DuplicateDatabase):
                connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        return connection.info.server_version


# The process that wants an embedded server


def _start_embedded(database: str, unusable: str) -> tuple[str, str]:
    """Start a keeper; return the server's URL and a phrase saying where it runs."""
    global _keeper
    keeper = subprocess.Popen(
        [sys.executable, __file__, "keep", database],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert keeper.stdout is not None
    handshake = keeper.stdout.readline()
    keeper.stdout.close()
    crashed = {"error": "its keeper process failed; see above"}
    answer = json.loads(handshake) if handshake.startswith("{") else crashed
    if "error" in answer:
        _release(keeper, os.getpid())
        raise NoDatabase(
            f"No PostgreSQL for the example project: DATABASE_URL is not set, {unusable}, and the "
            f"embedded server did not start ({answer['error']}). Set DATABASE_URL, start "
            "PostgreSQL on 127.0.0.1:5432, or install the dev extra (pgserver)."
        )
    _keeper = keeper
    atexit.register(_release, keeper, os.getpid())
    folder = Path(answer["directory"])
    shown = folder.relative_to(BASE_DIR) if folder.is_relative_to(BASE_DIR) else folder
    return answer["url"], (
        f"a throwaway embedded PostgreSQL {answer['version']} at 127.0.0.1:{answer['port']}, "
        f"in {shown}/"
    )


def _release(keeper: subprocess.Popen[str], owner: int) -> None:
    """Close the keeper's pipe and wait while it stops the server (not in forked children)."""
    if os.getpid() != owner:
        return
    if keeper.stdin is not None:
        keeper.stdin.close()
    try:
        keeper.wait(timeout=60)
    except subprocess.TimeoutExpired:
        _say(f"the embedded server's keeper (pid {keeper.pid}) is still stopping it")


# The keeper


@dataclass
class EmbeddedServer:
    """A throwaway cluster in `directory`, run with the PostgreSQL programs in `bindir`."""

    directory: Path
    bindir: Path
    port: int = 0

    @property
    def data(self) -> Path:
        return self.directory / "data"

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def create(self) -> None:
        """Make the folder and the cluster, and start the server on a free port."""
        if self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir(mode=0o700, parents=True)
        account = _unprivileged_account()
        if account is not None:
            os.chown(self.directory, *account)
        initdb = self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
            "--encoding=UTF8", "--no-locale", "--no-sync",
        )  # fmt: skip
        if initdb.returncode != 0:
            raise NoDatabase(f"initdb failed: {_last_lines(initdb.stdout)}")
        with (self.data / "postgresql.conf").open("a") as config:
            config.write(EMBEDDED_CONFIG)
        failure = ""
        for _ in range(3):  # another process may take the free port before the server binds it
            self.port = free_port()
            started = self._run(
                "pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data),
                "-l", str(self.directory / "server.log"), "-o", f"-p {self.port}",
            )  # fmt: skip
            if started.returncode == 0:
                return
            failure = _last_lines(self._read("server.log") or started.stdout)
        raise NoDatabase(f"pg_ctl start failed: {failure}")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server if it runs, then delete its folder."""
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "stop", "-w", "-t", "30", "-m", mode, "-D", str(self.data))
        shutil.rmtree(self.directory, ignore_errors=True)

    def _run(self, program: str, *args: str) -> subprocess.CompletedProcess[str]:
        """Run one of the PostgreSQL programs, as the unprivileged account when we are root."""
        account = _unprivileged_account()
        return subprocess.run(
            [str(self.bindir / program), *args],
            cwd=self.directory,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=120,
            check=False,
            user=None if account is None else account[0],
            group=None if account is None else account[1],
            extra_groups=None if account is None else [],
        )

    def _read(self, name: str) -> str:
        try:
            return (self.directory / name).read_text()
        except OSError:
            return ""


def _last_lines(text: str) -> str:
    return " / ".join(text.strip().splitlines()[-3:])


def _unprivileged_account() -> tuple[int, int] | None:
    """(uid, gid) to run PostgreSQL as when we are root (initdb refuses root), else None."""
    if os.geteuid() != 0:
        return None
    for name in UNPRIVILEGED_USERS:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return entry.pw_uid, entry.pw_gid
    raise NoDatabase(f"running as root, and none of the accounts {UNPRIVILEGED_USERS} exists")


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _reachable(path: Path, account: tuple[int, int] | None) -> bool:
    """Whether `account` may pass through every folder down to `path` (None: we are it)."""
    if account is None:
        return True
    uid, gid = account
    for folder in (path, *path.parents):
        mode = folder.stat()
        search = stat.S_IXUSR if mode.st_uid == uid else stat.S_IXGRP if mode.st_gid == gid else 0
        if not mode.st_mode & (search or stat.S_IXOTH):
            return False
    return True


def embedded_root() -> Path:
    """`.local/` in the project, or a temporary folder when PostgreSQL's account cannot reach it.

    As root, the server runs as another account, and a checkout under /root (mode 0700) is out
    of its reach.
    """
    return EMBEDDED_ROOT if _reachable(BASE_DIR, _unprivileged_account()) else FALLBACK_ROOT


def postgres_bindir() -> Path:
    """The folder of initdb and pg_ctl: SWITCHBOARD_POSTGRES_BIN, pgserver's, or the system's.

    As root, only a folder the server's account can reach will do.
    """
    configured = os.environ.get("SWITCHBOARD_POSTGRES_BIN")
    candidates = [Path(configured)] if configured else _bindir_candidates()
    account = _unprivileged_account()
    for candidate in candidates:
        programs = (candidate / "initdb").is_file() and (candidate / "pg_ctl").is_file()
        if programs and _reachable(candidate, account):
            return candidate
    raise NoDatabase(
        f"no initdb and pg_ctl in {configured} that PostgreSQL's account can run"
        if configured
        else "no PostgreSQL programs: neither the pgserver wheel nor a system PostgreSQL"
        + ("" if account is None else " that PostgreSQL's account can run")
    )


def _bindir_candidates() -> list[Path]:
    candidates = []
    spec = importlib.util.find_spec("pgserver")
    if spec is not None:
        candidates += [Path(f, "pginstall", "bin") for f in spec.submodule_search_locations or ()]
    initdb = shutil.which("initdb")
    if initdb is not None:
        candidates.append(Path(initdb).parent)
    debian = Path("/usr/lib/postgresql").glob("*/bin")  # initdb is not on PATH there
    candidates += sorted(debian, key=lambda path: _version(path.parent.name), reverse=True)
    return candidates


def _version(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split(".") if part.isdigit())


def _alive(pid: int) -> bool:
    """Whether `pid` exists; a zombie not reaped yet does, so its owner is still running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process
    return True


def sweep(root: Path, bindir: Path) -> list[Path]:
    """Stop and delete the servers whose keeper is gone; return their folders."""
    swept = []
    for directory in sorted(root.glob("postgres-*")):
        pid = directory.name.removeprefix("postgres-")
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        EmbeddedServer(directory, bindir).stop(mode="immediate")
        swept.append(directory)
    return swept


def keep(database: str) -> int:
    """The keeper: start a server, hand its URL over on stdout, stop it when stdin closes."""
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)
    server: EmbeddedServer | None = None
    try:
        try:
            bindir = postgres_bindir()
            root = embedded_root()
            root.mkdir(mode=0o755, exist_ok=True)
            sweep(root, bindir)
            server = EmbeddedServer(root / f"postgres-{os.getpid()}", bindir)
            server.create()
            version = _ensure_database("127.0.0.1", server.port, database)
        except (NoDatabase, OSError, psycopg.Error, subprocess.SubprocessError) as error:
            print(json.dumps({"error": _first_line(error)}), flush=True)
            return 1
        answer = {
            "url": server.url(database),
            "port": server.port,
            "version": f"{version // 10000}.{version % 10000}",
            "directory": str(server.directory),
        }
        print(json.dumps(answer), flush=True)
        sys.stdin.read()  # returns at end of file: the owner has exited or let go
        return 0
    finally:
        if server is not None:
            server.stop()


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


# The `run` command


def run(command: list[str]) -> int:
    """Run `command` with DATABASE_URL chosen for it; return its exit status."""
    ensure_database_url()
    child = subprocess.Popen(command)

    def forward(signum: int, frame: FrameType | None) -> None:
        child.send_signal(signum)

    # Ctrl-C reaches the child from the terminal already: wait for it to finish, then clean up.
    # A SIGTERM is sent to us alone, so it is passed on.
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    signal.signal(signal.SIGTERM, forward)
    status = child.wait()
    return status if status >= 0 else 128 - status


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "keep":
        return keep(argv[1])
    if argv[:1] == ["run"]:
        command = argv[2:] if argv[1:2] == ["--"] else argv[1:]
        if command:
            return run(command)
    print("usage: python -m devtools.database run -- COMMAND...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
