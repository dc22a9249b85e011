"""`manage.py demo` and `demo_crash` as a user runs them: real processes, stopped by signals."""

from __future__ import annotations

import io
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import override_settings

from devtools.database import (
    CHOICE_VARIABLE,
    embedded_root,
    free_port,
    postgres_bindir,
    sweep,
)
from devtools.processes import Console
from example_project import tasks
from example_project.demo import Demo, Seeded
from switchboard_todos.models import Event, State, Todo
from switchboard_todos.shutdown import Shutdown
from tests.conftest import ROOT
from tests.helpers import OutputLines, running, wait_until

STARTED = re.compile(r"started (\S+) \(pid (\d+)\)")


class DemoProcess(OutputLines):
    """A demo command run as a user runs it, its output lines collected as they come."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a process group of its own, as a terminal's foreground job
        )
        super().__init__(self.process.stdout)

    def wait_for(self, text: str, timeout: float = 90) -> str:
        line: str = wait_until(lambda: self.said(text) or self.process.poll(), text, timeout)
        assert isinstance(line, str), f"ended with {self.process.returncode}:\n{self.output}"
        return line

    def children(self) -> dict[str, int]:
        """The demo's children, as it announced them: name → pid."""
        return {name: int(pid) for line in self.lines for name, pid in STARTED.findall(line)}

    def finish(self, timeout: float = 90) -> int:
        code = self.process.wait(timeout)
        self.join_reader(10)
        assert self.process.stdout is not None
        self.process.stdout.close()
        return code

    def kill(self) -> None:
        """Teardown: SIGKILL the demo and whatever it started that is still running."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        for pid in self.children().values():
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        self.finish(30)


@pytest.fixture
def demo_env(subprocess_env: dict[str, str]) -> dict[str, str]:
    """The example project's settings, DEBUG on, against the test database."""
    env = {name: value for name, value in subprocess_env.items() if name != "SECRET_KEY"}
    return {**env, "DJANGO_SETTINGS_MODULE": "example_project.settings", "DEBUG": "1"}


@pytest.fixture
def start_demo() -> Iterator[type[DemoProcess]]:
    started: list[DemoProcess] = []

    class Tracked(DemoProcess):
        def __init__(self, command: list[str], env: dict[str, str]) -> None:
            super().__init__(command, env)
            started.append(self)

    yield Tracked
    for demo in started:
        demo.kill()


def manage(*args: str) -> list[str]:
    return [sys.executable, "manage.py", *args]


def answers(url: str) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as response:
        status: int = response.status
    return status


def assert_all_gone(demo: DemoProcess, expected: set[str]) -> None:
    children = demo.children()
    assert set(children) == expected, demo.output
    for name, pid in children.items():
        assert not running(pid), f"{name} (pid {pid}) outlived the demo"


@pytest.mark.django_db(transaction=True)
def test_demo_runs_everything_and_ctrl_c_stops_it(
    start_demo: type[DemoProcess], demo_env: dict[str, str]
) -> None:
    """Ready with the admin answering; every seeded item ends as announced; Ctrl-C exits 0."""
    port = free_port()
    demo = start_demo(manage("demo", "--port", str(port)), demo_env)
    ready = demo.wait_for("ready: ")
    admin = f"http://127.0.0.1:{port}/admin/"
    assert admin in ready and "(user demo, password " in ready
    assert answers(admin + "login/") == 200
    assert demo.said("database: database 'test_")  # the test database, from DATABASE_URL

    flaky = demo.wait_for(": done on attempt 3: ", timeout=60)
    assert "example.flaky td_" in flaky and '{"succeeded_on_attempt": 3}' in flaky
    assert "example.doomed td_" in demo.wait_for("dead letter after 3 attempts")
    assert "task count_words td_" in demo.wait_for("SUCCESSFUL on attempt 1: ")
    retried = demo.wait_for("SUCCESSFUL on attempt 2: ")
    assert "task succeed_on_retry td_" in retried and '{"succeeded_on_attempt": 2}' in retried
    assert "done on attempt 1" in demo.wait_for("github.push td_")
    assert len([line for line in demo.lines if "a duplicate of td_" in line]) == 2
    assert demo.said("with a forged signature: 401")
    push = Event.objects.get(delivery_id__endswith="-push")  # sent three times, stored once
    assert push.todos.get().state == State.DONE
    assert Event.objects.count() == Todo.objects.filter(source="github").count() == 3

    os.killpg(demo.process.pid, signal.SIGINT)  # Ctrl-C: the whole foreground process group
    assert demo.finish() == 0, demo.output
    assert demo.said("stopped: nothing is left running")
    assert_all_gone(demo, {"web", "worker-1", "reaper"})


@pytest.mark.django_db(transaction=True)
def test_sigterm_stops_the_demo_and_all_its_workers(
    start_demo: type[DemoProcess], demo_env: dict[str, str]
) -> None:
    """SIGTERM to the demo alone stops every child; --no-seed seeds nothing."""
    port = free_port()
    demo = start_demo(manage("demo", "--port", str(port), "--workers", "2", "--no-seed"), demo_env)
    demo.wait_for("ready: ")
    demo.process.send_signal(signal.SIGTERM)
    assert demo.finish() == 0, demo.output
    assert_all_gone(demo, {"web", "worker-1", "worker-2", "reaper"})
    assert not Todo.objects.exists()
    assert demo.said("What to look at") is None


@pytest.mark.skipif(sys.platform != "linux", reason="children die with their parent on Linux")
@pytest.mark.django_db(transaction=True)
def test_children_of_a_killed_demo_stop_too(
    start_demo: type[DemoProcess], demo_env: dict[str, str]
) -> None:
    """A demo killed with SIGKILL cannot stop its children: the kernel tells them to stop."""
    demo = start_demo(manage("demo", "--port", str(free_port()), "--no-seed"), demo_env)
    demo.wait_for("ready: ")
    demo.process.kill()
    demo.finish()
    children = demo.children()
    assert len(children) == 3
    assert wait_until(
        lambda: not any(running(pid) for pid in children.values()), "every child to stop"
    )


def test_demo_on_the_embedded_database(
    start_demo: type[DemoProcess], subprocess_env: dict[str, str]
) -> None:
    """No DATABASE_URL and nothing at the local address: make demo's command line still works,
    and Ctrl-C leaves no child and no PostgreSQL running."""
    env = {
        name: value
        for name, value in subprocess_env.items()
        if name not in ("DATABASE_URL", CHOICE_VARIABLE, "SWITCHBOARD_POSTGRES_BIN", "SECRET_KEY")
    }
    env.update(
        DJANGO_SETTINGS_MODULE="example_project.settings",
        DEBUG="1",
        SWITCHBOARD_LOCAL_POSTGRES=f"127.0.0.1:{free_port()}",
    )
    port = free_port()
    wrapper = [sys.executable, "-m", "devtools.database", "run", "--"]
    demo = start_demo([*wrapper, *manage("demo", "--port", str(port), "--no-seed")], env)
    try:
        said = demo.wait_for("demo     | database: a throwaway embedded PostgreSQL", timeout=120)
        folder = ROOT / re.findall(r"in (\S+)/", said)[0]
        server = int((folder / "data" / "postmaster.pid").read_text().split()[0])
        demo.wait_for("ready: ", timeout=120)
        assert answers(f"http://127.0.0.1:{port}/admin/login/") == 200

        os.killpg(demo.process.pid, signal.SIGINT)
        assert demo.finish() == 0, demo.output
        assert_all_gone(demo, {"web", "worker-1", "reaper"})
        assert wait_until(lambda: not running(server), "the embedded server to stop")
        assert not folder.exists()
    finally:
        sweep(embedded_root(), postgres_bindir())


@pytest.mark.django_db(transaction=True)
def test_demo_crash_loses_nothing_and_leaves_nothing_running(
    start_demo: type[DemoProcess], demo_env: dict[str, str]
) -> None:
    """One worker is killed mid-todo; its todo is finished by another; every todo is done."""
    demo = start_demo(manage("demo_crash", "--todos", "4"), demo_env)
    assert demo.finish(timeout=110) == 0, demo.output
    assert demo.said("summary: 4 of 4 todos done, nothing lost"), demo.output
    killed = re.findall(r"SIGKILL (worker-\d) \(pid \d+\) while it runs (td_\w+)", demo.output)
    assert len(killed) == 1, demo.output
    worker, todo_prefix = killed[0]
    assert demo.said(f"the lease of {todo_prefix} lapsed")
    assert demo.said(f"{worker} (pid {demo.children()[worker]}) was killed")

    todos = Todo.objects.filter(queue="crash-demo")
    assert [todo.state for todo in todos] == [State.DONE] * 4
    rescued = todos.get(id__startswith=todo_prefix)
    assert rescued.attempt == 2
    assert rescued.owner is not None and not rescued.owner.endswith(worker)
    assert [entry["error"]["type"] for entry in rescued.errors] == ["LeaseExpired"]
    assert rescued.errors[0]["owner"].endswith(worker)
    assert_all_gone(demo, {"worker-1", "worker-2", "worker-3", "reaper"})


@pytest.mark.django_db
def test_demo_refuses_with_debug_off() -> None:
    """With DEBUG off nothing happens: no migration, no user, no process."""
    with pytest.raises(CommandError, match="refuses to run with DEBUG off; run it with DEBUG=1"):
        call_command("demo")
    assert not get_user_model().objects.exists()


@override_settings(DEBUG=True)
def test_demo_refuses_a_port_in_use() -> None:
    """A port something listens on is named, with how to choose another."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"Port {port} of 127.0.0.1 is in use"):
            call_command("demo", "--port", str(port))


@pytest.mark.parametrize(
    ("command", "args", "message"),
    [
        ("demo", ["--workers", "0"], "'0' must be 1 or more"),
        ("demo", ["--workers", "17"], "at most 16 workers"),
        ("demo", ["--port", "70000"], "not a TCP port"),
        ("demo_crash", ["--workers", "1"], "--workers must be 2 or more"),
        ("demo_crash", ["--ttl", "0"], "must be more than zero"),
    ],
)
def test_bad_arguments_are_usage_errors(command: str, args: list[str], message: str) -> None:
    """Refused before anything starts."""
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command(command, *args)


def reporter() -> tuple[Demo, io.StringIO]:
    out = io.StringIO()
    return Demo(Console(out), port=8000, workers=1, seed=True), out


@pytest.mark.django_db
def test_each_ending_is_reported_once_and_again_after_a_requeue(
    make_todo: Callable[..., Todo],
) -> None:
    """A dead letter is reported once however often the demo looks; requeued and done, again."""
    dead = make_todo(state=State.FAILED, kind="example.doomed", attempt=3)
    demo, out = reporter()
    demo.seeded = [Seeded("example.doomed", dead.id)]
    demo.report()
    demo.report()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    assert f"demo     | example.doomed {dead.id}: dead letter after 3 attempts (boom)" in lines[0]
    assert "requeue it at http://127.0.0.1:8000/admin/switchboard_todos/todo/td_5F" in lines[0]

    Todo.objects.requeue(dead.id)
    Todo.objects.claim(dead.id, "w1", 30)
    Todo.objects.complete(dead.id, "w1", {"ok": True})
    demo.report()
    assert out.getvalue().splitlines()[1:] == [
        f'demo     | example.doomed {dead.id}: done on attempt 1: {{"ok": true}}'
    ]


@pytest.mark.django_db
def test_a_task_is_reported_with_its_task_result() -> None:
    """The outcome of a django.tasks task is read back through the backend's get_result."""
    result = tasks.count_words.enqueue("one two two")
    demo, out = reporter()
    demo.seeded = [Seeded("task count_words", result.id, is_task=True)]
    demo.report()
    assert out.getvalue() == ""  # still pending
    Todo.objects.claim(result.id, "w1", 30)
    Todo.objects.complete(result.id, "w1", {"words": 3})
    demo.report()
    assert out.getvalue() == (
        f'demo     | task count_words {result.id}: SUCCESSFUL on attempt 1: {{"words": 3}}\n'
    )


def test_interrupts_count_every_signal_and_restore_the_handlers() -> None:
    """Each SIGTERM or SIGINT is counted, none ends the process; the old handlers come back."""
    before = signal.getsignal(signal.SIGTERM)
    interrupts = Shutdown(every_signal=True)
    with interrupts:
        assert not interrupts.wait(0.01)
        os.kill(os.getpid(), signal.SIGTERM)
        assert interrupts.wait(5)
        os.kill(os.getpid(), signal.SIGINT)
        assert interrupts.wait(5, seen=1)
        assert (interrupts.count, interrupts.signal) == (2, signal.SIGINT)
        assert not interrupts.wait(0.01, seen=2)
    assert signal.getsignal(signal.SIGTERM) is before
