"""The shipped systemd units: verified by systemd, filled in by `todo_systemd_units`, runnable."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db.models.functions import Now

from switchboard_todos.models import State, Todo
from switchboard_todos.units import PLACEHOLDERS, render, unit_files
from tests.conftest import ROOT, database_url
from tests.helpers import read_until

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None,
    reason="systemd-analyze is not installed (it comes with systemd); it verifies the units",
)
SERVICES = [name for name in unit_files() if name.endswith(".service")]
LONG_RUNNING = [
    "switchboard-reaper.service",
    "switchboard-scheduler.service",
    "switchboard-worker@.service",
]


def directives(text: str) -> dict[str, list[str]]:
    """Every `Key=value` of a unit file as {"Section.Key": [values]}, comments dropped."""
    found: dict[str, list[str]] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.setdefault(f"{section}.{key}", []).append(value)
    return found


@pytest.fixture
def env_file(tmp_path: Path) -> Path:
    path = tmp_path / "env"
    path.write_text(f"DATABASE_URL={database_url()}\nDJANGO_SETTINGS_MODULE=tests.settings\n")
    return path


@pytest.fixture
def units(tmp_path: Path, env_file: Path) -> Path:
    """The units as `todo_systemd_units` writes them for this checkout and its virtualenv."""
    output = tmp_path / "units"
    call_command(
        "todo_systemd_units",
        "--output",
        str(output),
        "--user",
        "switchboard",
        "--project-dir",
        str(ROOT),
        "--env-file",
        str(env_file),
        stdout=StringIO(),
    )
    return output


def verify(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    assert SYSTEMD_ANALYZE is not None
    return subprocess.run(
        [SYSTEMD_ANALYZE, "verify", *map(str, paths)], capture_output=True, text=True, timeout=120
    )


# What systemd says


@needs_systemd_analyze
def test_every_unit_passes_systemd_analyze_verify(units: Path) -> None:
    """Filled in, every unit verifies without a single warning."""
    result = verify(sorted(units.iterdir()))
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


@needs_systemd_analyze
def test_verify_catches_placeholders_left_in(tmp_path: Path) -> None:
    """The check above can fail: the shipped file as is, placeholders and all, is refused."""
    shipped = tmp_path / "switchboard-reaper.service"
    shipped.write_text(unit_files()["switchboard-reaper.service"])
    result = verify([shipped])
    assert result.returncode != 0
    assert "WorkingDirectory= path is not absolute: @PROJECT_DIR@" in result.stderr


@needs_systemd_analyze
def test_verify_catches_a_mistyped_setting(units: Path) -> None:
    """A setting systemd cannot parse is only a warning, which the check above also refuses."""
    unit = units / "switchboard-reaper.service"
    unit.write_text(unit.read_text().replace("KillSignal=SIGTERM", "KillSignal=SIGTREM"))
    assert "Failed to parse signal name" in verify([unit]).stderr


# What the files say


def test_units_use_only_documented_placeholders() -> None:
    """Services use all four placeholders, timers none, and nothing else looks like one."""
    for name, text in unit_files().items():
        used = set(re.findall(r"@([A-Z_]+)@", text))
        assert used == (set(PLACEHOLDERS) if name.endswith(".service") else set()), name


def test_render_refuses_an_unknown_placeholder() -> None:
    with pytest.raises(KeyError, match="@HOME@"):
        render("ExecStart=@HOME@/bin/x", {"HOME": "/root"})


@pytest.mark.parametrize("name", SERVICES)
def test_services_run_unprivileged_and_hardened(name: str) -> None:
    """Every service: a non-root User=, the environment file, and the common hardening."""
    found = directives(unit_files()[name])
    assert found["Service.User"] == ["@USER@"]
    assert found["Service.EnvironmentFile"] == ["@ENV_FILE@"]
    assert found["Service.WorkingDirectory"] == ["@PROJECT_DIR@"]
    for setting in ("NoNewPrivileges", "PrivateTmp", "PrivateDevices", "RestrictSUIDSGID"):
        assert found[f"Service.{setting}"] == ["yes"], setting
    assert found["Service.ProtectSystem"][0] in {"strict", "full"}
    assert found["Service.CapabilityBoundingSet"] == [""]


@pytest.mark.parametrize("name", LONG_RUNNING)
def test_long_running_services_restart_and_stop_on_sigterm(name: str) -> None:
    """Long-running services restart on failure only and get SIGTERM with time to finish."""
    found = directives(unit_files()[name])
    assert found["Service.Restart"] == ["on-failure"]
    assert found["Service.KillSignal"] == ["SIGTERM"]
    assert found["Install.WantedBy"] == ["multi-user.target"]


def test_the_worker_stop_timeout_outlasts_a_minute_lease() -> None:
    """The documented rule: TimeoutStopSec exceeds the lease TTL it is written for (60 s)."""
    found = directives(unit_files()["switchboard-worker@.service"])
    assert int(found["Service.TimeoutStopSec"][0]) > 60


@pytest.mark.parametrize(
    ("timer", "service"),
    [
        ("switchboard-reaper.timer", "switchboard-reaper-sweep.service"),
        ("switchboard-purge.timer", "switchboard-purge.service"),
    ],
)
def test_timers_start_a_oneshot(timer: str, service: str) -> None:
    found = directives(unit_files()[timer])
    assert found["Timer.Unit"] == [service]
    assert directives(unit_files()[service])["Service.Type"] == ["oneshot"]


# What the units run


def exec_start(unit: Path, env_file: Path, instance: str = "") -> tuple[list[str], dict[str, str]]:
    """ExecStart= as systemd would run it: Environment=, then EnvironmentFile=, `${X}` and %i."""
    found = directives(unit.read_text())
    assignments = [pair for line in found["Service.Environment"] for pair in shlex.split(line)]
    assignments += env_file.read_text().splitlines()
    environment = dict(assignment.split("=", 1) for assignment in assignments)
    argv = [
        re.sub(r"\$\{(\w+)\}", lambda match: environment[match.group(1)], word)
        for word in shlex.split(found["Service.ExecStart"][0].replace("%i", instance))
    ]
    assert found["Service.WorkingDirectory"] == [str(ROOT)]
    return argv, {**os.environ, **environment}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "switchboard-reaper-sweep.service",
            "Reaped lapsed leases: 1 requeued, 0 dead-lettered.\n",
        ),
        ("switchboard-purge.service", "Deleted 1 done todo completed over 30d ago in 1 batch:"),
    ],
)
def test_oneshot_units_run_their_command(
    units: Path, env_file: Path, make_todo: Callable[..., Todo], name: str, expected: str
) -> None:
    """The timers' services run as written against the database in the environment file."""
    make_todo(state=State.CLAIMED, lease_expires_in=timedelta(seconds=-5))
    make_todo(state=State.DONE, completed_at=Now() - timedelta(days=31))
    argv, env = exec_start(units / name, env_file)
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(expected)


def run_until_sigterm(argv: list[str], env: dict[str, str], *lines: str) -> int:
    """Start a service's command, read until each of `lines` in turn, send SIGTERM; its status."""
    process = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        for line in lines:
            read_until(process.stdout, line)
        process.send_signal(signal.SIGTERM)
        return process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


@pytest.mark.django_db(transaction=True)
def test_the_reaper_service_runs_until_sigterm(
    units: Path, env_file: Path, make_todo: Callable[..., Todo]
) -> None:
    """The reaper service's command loops, reaps, and stops with status 0 on SIGTERM."""
    make_todo(state=State.CLAIMED, lease_expires_in=timedelta(seconds=-5))
    argv, env = exec_start(units / "switchboard-reaper.service", env_file)
    assert argv[2:] == ["reap_todos", "--loop", "--interval", "10"]
    assert run_until_sigterm(argv, env, "Reaped lapsed leases: 1 requeued") == 0


@pytest.mark.django_db(transaction=True)
def test_the_scheduler_service_enqueues_ticks_until_sigterm(units: Path, env_file: Path) -> None:
    """The scheduler service's command enqueues each tick of a schedule once, every second."""
    schedule = {"cron": "* * * * * *", "queue": "ticks", "kind": "test.tick"}
    with env_file.open("a") as file:
        file.write(f"SWITCHBOARD_TODOS_SCHEDULES={json.dumps({'every-second': schedule})}\n")
    argv, env = exec_start(units / "switchboard-scheduler.service", env_file)
    assert argv[2:] == ["todo_scheduler", "--loop", "--interval", "1"]
    enqueued = "Scheduled: 1 scheduled todo enqueued."
    assert run_until_sigterm(argv, env, enqueued, enqueued) == 0
    todos = Todo.objects.filter(queue="ticks")
    keys = [todo.idempotency_key for todo in todos]
    assert len(keys) >= 2 and len(set(keys)) == len(keys)


def test_the_worker_template_runs_the_instance_queue(units: Path, env_file: Path) -> None:
    """switchboard-worker@emails-high.service runs todo_worker for queue "emails-high"."""
    argv, _ = exec_start(units / "switchboard-worker@.service", env_file, instance="emails-high")
    assert argv == [
        sys.executable,
        str(ROOT / "manage.py"),
        "todo_worker",
        "--queue",
        "emails-high",
        "--concurrency",
        "4",
        "--shutdown-timeout",
        "60",
    ]


# The command that writes them


def test_todo_systemd_units_fills_in_this_virtualenv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default the units run the Python running the command, in the current directory."""
    monkeypatch.chdir(ROOT)
    out = StringIO()
    call_command(
        "todo_systemd_units", "--output", str(tmp_path), "--user", "switchboard", stdout=out
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(unit_files())
    reaper = (tmp_path / "switchboard-reaper.service").read_text()
    assert f"ExecStart={sys.executable} {ROOT}/manage.py reap_todos --loop" in reaper
    assert "EnvironmentFile=/etc/switchboard-todos/env" in reaper
    assert not re.search(r"@[A-Z_]+@", reaper)
    lines = out.getvalue().splitlines()
    assert lines[0] == f"Wrote {tmp_path / 'switchboard-purge.service'}"
    assert "Create /etc/switchboard-todos/env" in out.getvalue()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--user", "root"], "must run as an unprivileged account"),
        (["--user", "two words"], "is not a valid account name"),
        (["--user", "app", "--project-dir", "/"], "holds no manage.py"),
        (["--user", "app", "--python", "/nonexistent/python"], "is not a file"),
        (["--user", "app", "--env-file", "/etc/my env"], "holds a space"),
        (["--user", "app", "--project-dir", "/srv/100%"], "'%'"),
        (["--output", "/tmp/x"], "the following arguments are required: --user"),
    ],
)
def test_todo_systemd_units_refuses_what_systemd_would_misread(
    tmp_path: Path, args: list[str], message: str
) -> None:
    """Root, odd account names, paths with spaces or specifiers, a missing manage.py: refused."""
    output = [] if "--output" in args else ["--output", str(tmp_path / "units")]
    with pytest.raises(CommandError, match=message):
        call_command("todo_systemd_units", *output, "--project-dir", str(ROOT), *args)
    assert not (tmp_path / "units").exists()
