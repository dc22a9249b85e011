"""`manage.py demo`: the whole product running from one command (docs/demo.md).

It migrates, makes a local admin user, and starts the web server, the workers and the reaper
as child processes (`devtools/processes.py`). Then it seeds todos and django.tasks tasks, and sends
signed webhook deliveries, repeats included, through the running server. Until Ctrl-C or
SIGTERM, it reports how each of them ended. Stopping ends every child cleanly: the workers
finish the todos in hand first.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import DatabaseError, connection

from devtools.processes import Child, Children, Console, database_in_words
from example_project import demo_agents, tasks, webhooks
from switchboard_todos.models import State, Todo
from switchboard_todos.shutdown import Shutdown

if TYPE_CHECKING or find_spec("django.tasks") is not None:
    from django.tasks import task_backends
else:  # Django 5.2: the backport
    from django_tasks import task_backends

ADMIN_USER = "demo"
TODOS_PATH = "/admin/switchboard_todos/todo/"
HEALTH_PATH = "/admin/switchboard_todos/todo/health/"
#: The webhook sources the demo signs deliveries for; each gets a secret unless one is set.
SOURCES = ("github", "example")
#: Short retries (1 s, 2 s, ...), so that the flaky todo succeeds within seconds, not 15.
BACKOFF = {"SWITCHBOARD_TODOS_BACKOFF_BASE": "1", "SWITCHBOARD_TODOS_BACKOFF_MAX": "10"}
DOOMED_ATTEMPTS = 3
REAP_INTERVAL = "5"
#: How long the web server may take to answer its first request.
READY_TIMEOUT = 60.0
#: How often the demo looks at the todos it seeded.
WATCH_INTERVAL = 0.5

TEXT = (
    "Webhooks arrive at least once and are duplicate-prone. Each delivery becomes a todo; "
    "workers claim todos under a lease, heartbeat while they work, and complete or fail them. "
    "A lease that expires brings its todo back, and a todo that fails too often is a dead "
    "letter until an operator requeues it."
)
PUSH = {
    "ref": "refs/heads/main",
    "repository": {"full_name": "octo/hello"},
    "pusher": {"name": "octocat"},
    "commits": [
        {"message": "Add the demo\n\nOne command runs it all.", "author": {"name": "Octo Cat"}},
        {"message": "Document the demo", "author": {"name": "Mona"}},
    ],
}
PULL_REQUEST = {
    "action": "opened",
    "number": 7,
    "repository": {"full_name": "octo/hello"},
    "pull_request": {"number": 7, "title": "Add webhooks", "user": {"login": "mona"}},
}
PING = {"zen": "Design for failure.", "hook_id": 1}


@dataclass
class Seeded:
    """A todo the demo made, followed until it ends."""

    label: str
    todo_id: str
    is_task: bool = False


def create_admin_user() -> tuple[str, str]:
    """Create the demo's superuser, or give it a new password; return the credentials."""
    password = secrets.token_urlsafe(9)
    user, _ = get_user_model().objects.get_or_create(username=ADMIN_USER)
    user.is_staff = user.is_superuser = user.is_active = True
    user.set_password(password)
    user.save()
    return ADMIN_USER, password


def port_is_free(port: int) -> bool:
    """Whether runserver can listen on `port` of 127.0.0.1 (as it does, reusing TIME_WAIT)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _short(value: object, limit: int = 160) -> str:
    text = json.dumps(value, separators=(", ", ": "))
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Demo:
    """One run of the demo: `run()` returns True when everything started and stopped cleanly."""

    def __init__(self, console: Console, *, port: int, workers: int, seed: bool) -> None:
        self.console = console
        self.port = port
        self.workers = workers
        self.seed = seed
        self.base = f"http://127.0.0.1:{port}"
        self.secrets = dict(getattr(settings, "WEBHOOK_SECRETS", {}))
        for source in SOURCES:
            self.secrets.setdefault(source, secrets.token_hex(16))
        self.run_id = secrets.token_hex(3)
        self.token = ""
        self.seeded: list[Seeded] = []
        self._reported: dict[str, tuple[Any, ...]] = {}
        self._database_lost = False
        # Never through a proxy: the server is on this machine.
        self._http = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def say(self, text: str = "") -> None:
        self.console.say("demo", text)

    def run(self) -> bool:
        interrupts = Shutdown(every_signal=True)
        with interrupts:
            self.say(f"database: {database_in_words()}")
            call_command("migrate", interactive=False, verbosity=0)
            self.say("migrations applied")
            credentials = create_admin_user()
            self.token = demo_agents.agent_token()
            if interrupts.count:
                return True
            children = Children(self.console, self.child_environment())
            try:
                watched = self.start_and_watch(children, interrupts, credentials)
            finally:
                stopped = children.stop(interrupts)
        self.say("stopped: nothing is left running" if stopped else "stopped, not cleanly")
        return watched and stopped

    def start_and_watch(
        self, children: Children, interrupts: Shutdown, credentials: tuple[str, str]
    ) -> bool:
        web = children.start_module(
            "web", "uvicorn", "example_project.asgi:application", "--port", str(self.port)
        )
        for number in range(1, self.workers + 1):
            children.start(f"worker-{number}", "todo_worker")
        children.start("reaper", "reap_todos", "--loop", "--interval", REAP_INTERVAL)
        if self.seed:
            self.seed_todos()
        if not self.wait_until_answering(web, interrupts):
            return bool(interrupts.count)
        children.start_module(
            "agent",
            "example_project.mcp_agent",
            f"{self.base}/mcp",
            "--queue",
            demo_agents.QUEUE,
            env={"SWITCHBOARD_TOKEN": self.token},
        )
        if self.seed:
            self.deliver_webhooks()
        self.print_ready(*credentials)
        return self.watch(children, interrupts)

    def child_environment(self) -> dict[str, str]:
        """One key, DEBUG, the webhook secrets and short retries for every child."""
        return {
            **BACKOFF,
            **os.environ,
            "DEBUG": "1",
            "SECRET_KEY": settings.SECRET_KEY,
            "WEBHOOK_SECRETS": ",".join(f"{name}={key}" for name, key in self.secrets.items()),
            "PYTHONUNBUFFERED": "1",
        }

    # Seeding

    def seed_todos(self) -> None:
        """Enqueue a flaky todo, a doomed one, two django.tasks tasks, and the agent's todos."""
        flaky, _ = Todo.objects.create_todo(
            kind="example.flaky", title="Fails twice on purpose, then succeeds"
        )
        doomed, _ = Todo.objects.create_todo(
            kind="example.doomed", title="Fails every attempt", max_attempts=DOOMED_ATTEMPTS
        )
        words = tasks.count_words.enqueue(TEXT)
        retried = tasks.succeed_on_retry.enqueue(failures=1)
        self.seeded += [
            Seeded("example.flaky", flaky.id),
            Seeded("example.doomed", doomed.id),
            Seeded("task count_words", words.id, is_task=True),
            Seeded("task succeed_on_retry", retried.id, is_task=True),
        ]
        for todo in demo_agents.seed_agent_todos(self.run_id):
            self.seeded.append(Seeded(f"{todo.queue} {todo.kind}", todo.id))
        for seeded in self.seeded:
            self.say(f"enqueued {seeded.label} {seeded.todo_id}")

    def deliver_webhooks(self) -> None:
        """POST signed deliveries to the running server: a push three times, then others."""
        push = f"demo-{self.run_id}-push"
        for copy in range(3):
            self.deliver("push", push, PUSH, again=copy > 0)
        self.deliver("pull_request", f"demo-{self.run_id}-pr", PULL_REQUEST)
        self.deliver("ping", f"demo-{self.run_id}-ping", PING)
        self.deliver("push", f"demo-{self.run_id}-forged", PUSH, forged=True)

    def deliver(
        self,
        event: str,
        delivery: str,
        payload: dict[str, Any],
        *,
        again: bool = False,
        forged: bool = False,
    ) -> None:
        body = json.dumps(payload).encode()
        secret = "not the secret" if forged else self.secrets["github"]
        headers = {
            "Content-Type": "application/json",
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery,
            webhooks.SIGNATURE_HEADER: webhooks.sign(secret, body),
        }
        status, answer = self.request("POST", "/hooks/github/", body, headers)
        what = f"POST /hooks/github/ {event} {delivery}{' again' if again else ''}"
        if forged:
            self.say(f"{what}, with a forged signature: {status} {answer.get('error', '')}")
        elif answer.get("duplicate"):
            self.say(f"{what}: {status}, a duplicate of {answer['todo_id']}: nothing written")
        elif status == 202:
            self.seeded.append(Seeded(f"github.{event}", answer["todo_id"]))
            self.say(f"{what}: {status}, new todo {answer['todo_id']}")
        else:
            self.say(f"{what}: {status} {answer}")

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """Send one request to the web server; return its status and JSON answer ({} if none)."""
        sent = urllib.request.Request(
            self.base + path, data=body, headers=headers or {}, method=method
        )
        try:
            with self._http.open(sent, timeout=10) as response:
                status, content = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, content = error.code, error.read()
        try:
            answer = json.loads(content)
        except ValueError:
            answer = {}
        return status, answer if isinstance(answer, dict) else {}

    # Running

    def wait_until_answering(self, web: Child, interrupts: Shutdown) -> bool:
        """Wait for the admin's login page to answer; False if the server ended or never did."""
        waited = 0.0
        while not interrupts.count:
            if web.returncode is not None:
                self.say(f"the web server ended (status {web.returncode}) before answering")
                return False
            try:
                if self.request("GET", "/admin/login/")[0] == 200:
                    return True
            except OSError:
                pass  # not listening yet
            if waited > READY_TIMEOUT:
                self.say(f"the web server did not answer within {READY_TIMEOUT:g} s")
                return False
            interrupts.wait(0.2)
            waited += 0.2
        return False

    def print_ready(self, user: str, password: str) -> None:
        self.say()
        self.say(f"ready: {self.base}/admin/  (user {user}, password {password})")
        self.say(f"  todos:        {self.base}{TODOS_PATH}")
        self.say(f"  queue health: {self.base}{HEALTH_PATH}")
        if self.seeded:
            self.say("What to look at (each is reported here when it ends):")
            self.say("  * example.flaky fails attempts 1 and 2 on purpose, then succeeds on 3;")
            self.say("    retries back off 1 s, then 2 s here (SWITCHBOARD_TODOS_BACKOFF_BASE=1).")
            self.say(f"  * example.doomed fails all {DOOMED_ATTEMPTS} attempts: a dead letter.")
            self.say("    Requeue it in the admin and watch it run (and fail) again.")
            self.say("  * the push delivery was sent three times: one event and one todo; the")
            self.say("    repeats were answered 200 with the same todo id. The forged one, 401.")
            self.say("  * django.tasks: count_words returns its counts; succeed_on_retry fails")
            self.say("    once and succeeds on attempt 2. Their todos are in the admin too.")
            self.say(f"  * queue {demo_agents.QUEUE}: the agent (a script with an MCP client and a")
            self.say(f"    token) claims and completes its todos: owner {demo_agents.AGENT}.")
        self.say(f"Agent {demo_agents.AGENT}: token {self.token} (shown once; rotated each run)")
        self.say(demo_agents.client_settings(self.base, self.token))
        self.say("The web server is uvicorn serving example_project.asgi: the admin, the webhooks,")
        self.say("/api/ and /mcp. Ctrl-C stops everything: the workers finish the todos in hand.")
        self.say()

    def watch(self, children: Children, interrupts: Shutdown) -> bool:
        """Report the seeded todos as they end, until a signal (True) or a child ends (False)."""
        while not interrupts.wait(WATCH_INTERVAL):
            ended = children.ended()
            if ended:
                for child in ended:
                    self.say(f"{child.name} ended (status {child.returncode}): stopping the demo")
                return False
            self.report()
        name = interrupts.signal.name if interrupts.signal else "a signal"
        self.say(f"{name}: stopping the web server, the workers and the reaper")
        return True

    def report(self) -> None:
        """Say how each seeded todo ended, once per ending (a requeued one may end again)."""
        if not self.seeded:
            return
        try:
            rows = Todo.objects.filter(id__in=[seeded.todo_id for seeded in self.seeded]).values(
                "id", "state", "attempt", "result", "completed_at"
            )
            ended = {row["id"]: row for row in rows if row["state"] in (State.DONE, State.FAILED)}
            for seeded in self.seeded:
                row = ended.get(seeded.todo_id)
                if row is None:
                    continue
                mark = (row["state"], row["attempt"], row["completed_at"])
                if self._reported.get(seeded.todo_id) != mark:
                    self._reported[seeded.todo_id] = mark
                    self.say(self.outcome(seeded, row))
        except DatabaseError as error:
            if not self._database_lost:
                self.say(f"cannot read the todos: {' '.join(str(error).split())}")
            self._database_lost = True
            connection.close()
        else:
            self._database_lost = False

    def outcome(self, seeded: Seeded, row: Mapping[str, Any]) -> str:
        what = f"{seeded.label} {seeded.todo_id}"
        if seeded.is_task:
            result = task_backends["default"].get_result(seeded.todo_id)
            shown = result.return_value if row["state"] == State.DONE else row["result"]
            return f"{what}: {result.status} on attempt {row['attempt']}: {_short(shown)}"
        if row["state"] == State.DONE:
            return f"{what}: done on attempt {row['attempt']}: {_short(row['result'])}"
        message = (row["result"] or {}).get("message", "")
        return (
            f"{what}: dead letter after {row['attempt']} attempts ({message}); requeue it at "
            f"{self.base}{TODOS_PATH}{quote(seeded.todo_id)}/change/"
        )
