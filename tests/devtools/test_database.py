"""The database default: DATABASE_URL, else the local server, else an embedded throwaway one."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection
from psycopg import sql

from devtools import database
from devtools.database import (
    CHOICE_VARIABLE,
    DATABASE_NAME_VARIABLE,
    FALLBACK_ROOT,
    NoDatabase,
    chosen,
    embedded_root,
    ensure_database_url,
    free_port,
    postgres_bindir,
    sweep,
)
from tests.conftest import ROOT
from tests.helpers import exists, running, wait_until

#: Run by a child process: report the server it was given, as JSON on stdout.
REPORT = """
import json, os, pathlib, psycopg
with psycopg.connect(os.environ["DATABASE_URL"]) as connection:
    directory = connection.execute("SELECT current_setting('data_directory')").fetchone()[0]
    version = connection.execute("SHOW server_version").fetchone()[0]
pid = int(pathlib.Path(directory, "postmaster.pid").read_text().split()[0])
print(json.dumps({"directory": directory, "pid": pid, "version": version}), flush=True)
"""

#: `make test`'s wrapper around a Python snippet: `[*RUN, "print(1)"]`.
RUN = [sys.executable, "-m", "devtools.database", "run", "--", sys.executable, "-c"]

SYSTEM_BINDIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"))


@pytest.fixture
def no_database_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """No DATABASE_URL, and a local address where nothing listens: the embedded server's case."""
    monkeypatch.delenv("DATABASE_URL")
    monkeypatch.delenv(CHOICE_VARIABLE, raising=False)
    monkeypatch.delenv("SWITCHBOARD_POSTGRES_BIN", raising=False)
    monkeypatch.setenv("SWITCHBOARD_LOCAL_POSTGRES", f"127.0.0.1:{free_port()}")
    return dict(os.environ)


@pytest.fixture
def sweep_after() -> Iterator[None]:
    """Stop whatever a test's killed processes left behind, even when the test fails."""
    yield
    sweep(embedded_root(), postgres_bindir())


def test_database_url_wins(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With DATABASE_URL set nothing is probed or started, and nothing is said."""
    monkeypatch.setenv("DATABASE_URL", "postgres://someone@db.internal:6432/app")
    monkeypatch.setenv("SWITCHBOARD_LOCAL_POSTGRES", "not an address")
    assert ensure_database_url() == "postgres://someone@db.internal:6432/app"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("named_by", ["argument", "variable"])
def test_local_server_is_used_and_its_database_created(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], named_by: str
) -> None:
    """The local server answers: its project database is created, exported and announced once.
    Its name is the caller's, else SWITCHBOARD_DATABASE_NAME's (CI's second leg has its own)."""
    test_server = connection.settings_dict
    if test_server["USER"] != "postgres" or test_server["PASSWORD"]:
        pytest.skip("the probe connects as postgres without a password")
    address = f"{test_server['HOST'] or '127.0.0.1'}:{test_server['PORT'] or 5432}"
    name = f"switchboard_probe_{uuid.uuid4().hex[:8]}"
    monkeypatch.delenv("DATABASE_URL")
    monkeypatch.delenv(CHOICE_VARIABLE, raising=False)
    monkeypatch.setenv("SWITCHBOARD_LOCAL_POSTGRES", address)
    if named_by == "variable":
        monkeypatch.setenv(DATABASE_NAME_VARIABLE, name)
    try:
        url = ensure_database_url(name if named_by == "argument" else None)
        assert url == f"postgres://postgres@{address}/{name}"
        assert os.environ["DATABASE_URL"] == url
        with psycopg.connect(url) as created:
            assert created.execute("SELECT current_database()").fetchone() == (name,)
        assert ensure_database_url(name) == url
        choice = f"the local PostgreSQL at {address}, database {name!r}"
        assert capsys.readouterr().err == f"switchboard: database: {choice}\n"
        assert chosen() == choice
    finally:
        host, port = address.rsplit(":", 1)
        with psycopg.connect(host=host, port=port, user="postgres", autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))


@pytest.mark.parametrize("programs", ["pgserver", "system"])
def test_embedded_server_lives_for_the_command_only(
    no_database_env: dict[str, str], programs: str
) -> None:
    """`run` starts a server for the command, passes on its exit status, then removes it."""
    env = dict(no_database_env)
    if programs == "system":
        if not SYSTEM_BINDIRS:
            pytest.skip("no system PostgreSQL in /usr/lib/postgresql")
        env["SWITCHBOARD_POSTGRES_BIN"] = str(SYSTEM_BINDIRS[-1])
    elif importlib.util.find_spec("pgserver") is None:
        pytest.skip("pgserver is not installed")
    command = f"{REPORT}\nraise SystemExit(3)"
    finished = subprocess.run(
        [*RUN, command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 3, finished.stderr
    report = json.loads(finished.stdout)
    version = report["version"].split()[0]
    said = f"switchboard: database: a throwaway embedded PostgreSQL {version} at 127.0.0.1:"
    assert said in finished.stderr
    assert finished.stderr.count("switchboard: database:") == 1
    assert Path(report["directory"]).is_relative_to(embedded_root())
    wait_until(lambda: not running(report["pid"]), "the server to stop with the command")
    assert not Path(report["directory"]).parent.exists()


@pytest.mark.parametrize(
    ("signum", "to_group", "status"),
    [(signal.SIGINT, True, 130), (signal.SIGTERM, False, 128 + signal.SIGTERM)],
    ids=["ctrl-c", "sigterm"],
)
def test_interrupted_run_stops_the_command_then_the_server(
    no_database_env: dict[str, str], signum: int, to_group: bool, status: int
) -> None:
    """Ctrl-C reaches the command from the terminal, SIGTERM is passed on; the server goes last."""
    command = (
        f"{REPORT}\nimport time\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    exit(130)"
    )
    with subprocess.Popen(
        [*RUN, command],
        cwd=ROOT,
        env=no_database_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # a process group of its own, as a terminal's foreground job
    ) as wrapper:
        report = read_report(wrapper)
        if to_group:
            os.killpg(wrapper.pid, signum)
        else:
            wrapper.send_signal(signum)
        assert wrapper.wait(timeout=60) == status
    assert not Path(report["directory"]).parent.exists()
    wait_until(lambda: not running(report["pid"]), "the server to stop")


def test_server_of_a_killed_process_is_stopped_by_its_keeper(
    no_database_env: dict[str, str], sweep_after: None
) -> None:
    """SIGKILL the process that asked for the server: its keeper still stops and deletes it."""
    with start_owner(no_database_env) as owner:
        report = read_report(owner)
        owner.kill()
    wait_until(lambda: not running(report["pid"]), "the server to stop with its owner")
    wait_until(lambda: not Path(report["directory"]).parent.exists(), "its folder to go")


def test_server_left_by_a_killed_keeper_is_swept(
    no_database_env: dict[str, str], sweep_after: None
) -> None:
    """A keeper killed outright leaves its server running; the next sweep stops and deletes it."""
    with start_owner(no_database_env) as owner:
        report = read_report(owner)
        folder = Path(report["directory"]).parent
        keeper = int(folder.name.removeprefix("postgres-"))
        os.kill(keeper, signal.SIGKILL)
        assert folder not in sweep(embedded_root(), postgres_bindir()), "in use by its owner"
        owner.kill()
    wait_until(lambda: not exists(keeper), "the dead keeper to be reaped")
    assert running(report["pid"]), "the server should be orphaned, not stopped"

    assert folder in sweep(embedded_root(), postgres_bindir())

    wait_until(lambda: not running(report["pid"]), "the server to stop")
    assert not folder.exists()


def test_no_postgres_anywhere_is_a_clear_error(
    no_database_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Nothing listening and no PostgreSQL programs: the error says what to do."""
    monkeypatch.setenv("SWITCHBOARD_POSTGRES_BIN", str(tmp_path))
    with pytest.raises(NoDatabase, match="nothing usable at 127.0.0.1:.*Set DATABASE_URL") as error:
        ensure_database_url()
    assert f"no initdb and pg_ctl in {tmp_path}" in str(error.value)
    assert "DATABASE_URL" not in os.environ


#: Run by a child process: ask for a database as settings do, report it, and stay.
STARTER = f"""
import os
from devtools.database import ensure_database_url
ensure_database_url()
{REPORT}
"""


def start_owner(env: dict[str, str]) -> subprocess.Popen[str]:
    """A process that asks for a database as settings do, reports it, then waits to be killed."""
    return subprocess.Popen(
        [sys.executable, "-c", f"{STARTER}\nimport time; time.sleep(120)"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def read_report(process: subprocess.Popen[str]) -> dict[str, Any]:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, "the child did not report a server"
    report: dict[str, Any] = json.loads(line)
    return report


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs PostgreSQL as another account")
def test_out_of_reach_project_sends_the_cluster_to_the_temp_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """As root, a checkout PostgreSQL's account cannot enter (under /root, say) is not used."""
    hidden = tmp_path / "hidden"
    (hidden / "project").mkdir(parents=True)
    hidden.chmod(0o700)
    monkeypatch.setattr(database, "BASE_DIR", hidden / "project")
    assert embedded_root() == FALLBACK_ROOT
    (hidden / "initdb").touch()
    (hidden / "pg_ctl").touch()
    monkeypatch.setenv("SWITCHBOARD_POSTGRES_BIN", str(hidden))
    with pytest.raises(NoDatabase, match="that PostgreSQL's account can run"):
        postgres_bindir()
