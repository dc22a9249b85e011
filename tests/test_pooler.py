"""The app through a real PgBouncer in transaction mode (tests/pgbouncer.py), two server
connections shared by every client: with SWITCHBOARD_TODOS_POOLER = "transaction" each part
works and leaves nothing on the server connections; without it, a clear error, never a hang."""

from __future__ import annotations

import collections
import logging
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import psycopg
import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db import connections
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse

from switchboard_todos import checks
from switchboard_todos.agents import accounts
from switchboard_todos.claims import listen, long_polls
from switchboard_todos.exceptions import PoolerNotConfigured
from switchboard_todos.models import Queue, State, Todo
from tests import pgbouncer as bouncers
from tests.asgi import serve
from tests.conftest import ROOT, child_environment, database_url, run_in_threads
from tests.helpers import OutputLines, wait_until

pytestmark = [pytest.mark.pooler, pytest.mark.django_db(transaction=True)]

Spawn = Callable[..., "subprocess.Popen[str]"]


@pytest.fixture(scope="module")
def pgbouncer(django_db_setup: None) -> Iterator[bouncers.PgBouncer]:
    """One PgBouncer for the module, in front of the test database's server."""
    yield from bouncers.start(dict(connections["default"].settings_dict))


@contextmanager
def through(bouncer: bouncers.PgBouncer) -> Iterator[None]:
    """Every connection opened inside the block, by any thread, goes through `bouncer`;
    database_url() (the children's DATABASE_URL) too."""
    entry = connections["default"].settings_dict
    saved = entry["HOST"], entry["PORT"]
    connections.close_all()
    entry["HOST"], entry["PORT"] = "127.0.0.1", str(bouncer.port)
    try:
        yield
    finally:
        long_polls.stop()
        connections.close_all()
        entry["HOST"], entry["PORT"] = saved


@pytest.fixture
def direct_url(transactional_db: None) -> str:
    """The test database's URL on the server itself, past the pooler."""
    return database_url()


@pytest.fixture
def pooled(
    pgbouncer: bouncers.PgBouncer, settings: Any, direct_url: str
) -> Iterator[bouncers.PgBouncer]:
    """The app through PgBouncer, with SWITCHBOARD_TODOS_POOLER = "transaction"."""
    settings.SWITCHBOARD_TODOS_POOLER = "transaction"
    with through(pgbouncer):
        yield pgbouncer


@pytest.fixture
def unset(pgbouncer: bouncers.PgBouncer, direct_url: str) -> Iterator[bouncers.PgBouncer]:
    """The app through PgBouncer, without SWITCHBOARD_TODOS_POOLER: it leaves its prepared
    statements and settings on the server connections, which are closed after."""
    with through(pgbouncer):
        yield pgbouncer
    pgbouncer.reconnect(dict(connections["default"].settings_dict))


@pytest.fixture
def subprocess_env(pooled: bouncers.PgBouncer) -> dict[str, str]:
    """A child's environment (`spawn`'s too): through PgBouncer, with the setting."""
    return {**child_environment(), "SWITCHBOARD_TODOS_POOLER": "transaction"}


def assert_nothing_left(bouncer: bouncers.PgBouncer, direct_url: str) -> None:
    """Each server connection of the pool, probed through PgBouncer, holds no prepared
    statement, no LISTEN and no setting of the app's: the settings are the server's defaults.

    A probe's transaction holds its server connection until it ends: two at once hold both.
    """
    probe = (
        "SELECT pg_backend_pid(), (SELECT count(*) FROM pg_prepared_statements),"
        " (SELECT count(*) FROM pg_listening_channels()), current_setting('plan_cache_mode'),"
        " current_setting('jit'), current_setting('statement_timeout'),"
        " current_setting('lock_timeout')"
    )
    with psycopg.connect(direct_url) as server:
        defaults = server.execute(probe).fetchone()
    assert defaults is not None
    url = bouncer.url(dict(connections["default"].settings_dict))
    probes = [psycopg.connect(url) for _ in range(bouncers.POOL_SIZE)]
    try:
        found = [connection.execute(probe).fetchone() for connection in probes]
    finally:
        for connection in probes:
            connection.close()
    assert len({row[0] for row in found if row}) == bouncers.POOL_SIZE, found
    assert [row[1:] for row in found if row] == [(0, 0, *defaults[3:])] * bouncers.POOL_SIZE


class WorkerProcess(OutputLines):
    """A `manage.py todo_worker` child, its log lines collected as they come."""

    def __init__(self, spawn: Spawn, *args: str) -> None:
        self.process = spawn(
            "manage", "todo_worker", "--import-module", "tests.worker_handlers", *args
        )
        super().__init__(self.process.stderr)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(30) == 0, self.output
        self.join_reader(5)
        assert "Traceback" not in self.output, self.output


def test_producers_claimers_a_worker_and_the_reaper_each_todo_once(
    pooled: bouncers.PgBouncer, direct_url: str, spawn: Spawn, subprocess_env: dict[str, str]
) -> None:
    """Four producers, three claimers and a worker process share two server connections;
    every todo is done once; the reaper takes a lapsed lease back; long polls and wait_for
    poll, and see what they wait for. The claimers' queue has a concurrency limit (never
    reached): each claim waits for its turn at the queue's row in the same round trip, one
    pipeline (cursors.one_round_trip), which the pooler keeps on one server connection."""
    Queue.objects.create(name="claims", concurrency_limit=15)
    worker = WorkerProcess(spawn, "--queue", "work", "--concurrency", "2")

    def produce(number: int) -> None:
        for n in range(50):
            queue = "work" if n % 2 else "claims"
            Todo.objects.create_todo(queue=queue, kind="test.noop", payload={"p": number, "n": n})

    run_in_threads(4, produce)

    def drain(number: int) -> list[str]:
        completed: list[str] = []
        while todos := Todo.objects.claim_batch("claims", f"claimer-{number}", 30, 5):
            for todo in todos:
                Todo.objects.complete(str(todo.id), f"claimer-{number}", {"by": number})
                completed.append(str(todo.id))
        return completed

    drained = [todo_id for ids in run_in_threads(3, drain) for todo_id in ids]
    assert len(drained) == len(set(drained)) == 100
    assert Todo.objects.filter(queue="claims").exclude(slot=None).count() == 100

    # A todo the worker finishes while this thread waits for it; a long poll that sees a todo
    # created after it began. Both poll (no LISTEN behind a transaction pooler).
    awaited, _ = Todo.objects.create_todo(queue="work", kind="test.echo", payload={"x": 1})
    assert Todo.objects.wait_for(str(awaited.id), timeout=30).state == State.DONE, worker.output
    polled: list[list[Todo]] = []

    def long_poll() -> None:
        try:
            polled.append(Todo.objects.claim_batch("late", "poller", 30, 1, wait=30))
        finally:
            connections.close_all()

    poll = threading.Thread(target=long_poll)
    poll.start()
    late, _ = Todo.objects.create_todo(queue="late", kind="test.noop")
    poll.join()
    assert [todo.id for todo in polled[0]] == [late.id]

    wait_until(
        lambda: Todo.objects.filter(queue="work", state=State.DONE).count() == 101,
        "the worker to finish its queue",
    )
    worker.stop()
    assert "polling" in worker.output, worker.output
    rows = Todo.objects.filter(queue__in=["work", "claims"]).values_list("state", "attempt")
    assert collections.Counter(rows) == {(State.DONE, 1): 201}

    # The reaper, a process of its own, takes back the lease of a holder that went away.
    Todo.objects.create_todo(queue="lapsed", kind="test.noop")
    [lapsed] = Todo.objects.claim_batch("lapsed", "gone", 30, 1)
    Todo.objects.filter(pk=lapsed.pk).update(lease_expires_at=Now())
    reaper = spawn("manage", "reap_todos")
    output, errors = reaper.communicate(timeout=60)
    assert reaper.returncode == 0, errors
    lapsed.refresh_from_db()
    assert (lapsed.state, lapsed.owner) == (State.PENDING, None), output
    assert_nothing_left(pooled, direct_url)


def test_the_admin_pages_and_an_http_agent(
    pooled: bouncers.PgBouncer, direct_url: str, subprocess_env: dict[str, str]
) -> None:
    """The admin's pages render, and an agent creates, long-polls, completes and waits for a
    todo over HTTP (uvicorn with a pool of its own in front of PgBouncer's)."""
    todo, _ = Todo.objects.create_todo(queue="pages", kind="test.noop")
    user = get_user_model().objects.create_superuser("operator", "op@example.com", "pw")
    client = Client()
    client.force_login(user)
    pages = [
        reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        for model in admin.site._registry
        if model._meta.app_label == "switchboard_todos"
    ]
    pages += [
        reverse("admin:switchboard_todos_todo_change", args=[todo.pk]),
        reverse("admin:switchboard_todos_todo_health"),
    ]
    for page in pages:
        assert client.get(page).status_code == 200, page

    token = accounts.create_agent("pooled", claim_queues=["agents"], create_queues=["agents"])[1]
    connections.close_all()
    with serve({**subprocess_env, "DATABASE_POOL_SIZE": "4"}) as (base, process):
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=base, headers=headers, timeout=60) as agent:
            claims: list[httpx.Response] = []
            poll = threading.Thread(
                target=lambda: claims.append(
                    agent.post("/claim/", json={"queues": ["agents"], "ttl": 30, "wait": 20})
                )
            )
            poll.start()
            with httpx.Client(base_url=base, headers=headers, timeout=60) as creator:
                created = creator.post("/todos/", json={"queue": "agents", "kind": "k"})
                assert created.status_code == 201, created.text
                todo_id = created.json()["id"]
                poll.join()
                assert [t["id"] for t in claims[0].json()["todos"]] == [todo_id], claims[0].text
                waited: list[httpx.Response] = []
                waiter = threading.Thread(
                    target=lambda: waited.append(
                        creator.get(f"/todos/{todo_id}/", params={"wait": 20})
                    )
                )
                waiter.start()
                done = agent.post(f"/todos/{todo_id}/complete/", json={"result": 1})
                assert done.status_code == 200, done.text
                waiter.join()
                assert waited[0].json()["state"] == State.DONE, waited[0].text
        process.terminate()
        output = process.communicate(timeout=30)[0]
    assert "Traceback" not in output, output
    assert_nothing_left(pooled, direct_url)


def test_without_the_setting_a_clear_error_names_it(
    unset: bouncers.PgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    """Unset: the system check warns, the prepared statements fail with an error that names
    the setting, so does the reaper's refused connection, and the listener refuses to listen
    (its waiters poll) rather than hear nothing."""
    [warning] = checks.check_pooler(databases=["default"])
    assert warning.id == "switchboard_todos.W051"

    with pytest.raises(PoolerNotConfigured, match='SWITCHBOARD_TODOS_POOLER = "transaction"'):
        # A second client meets the first one's prepared statement on the server connection
        # it gets, or misses its own on another.
        for _ in range(4):
            Todo.objects.create_todo(kind="test.noop")
            connections.close_all()

    # PgBouncer 1.18 refuses the worker's and reaper's server settings (startup `options`).
    reaper = subprocess.run(
        [sys.executable, "-m", "manage", "reap_todos"],
        cwd=ROOT, env=child_environment(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert reaper.returncode != 0
    assert "unsupported startup parameter" in reaper.stderr, reaper.stderr
    assert "set SWITCHBOARD_TODOS_POOLER" in reaper.stderr, reaper.stderr

    listener = listen.Listener()
    with caplog.at_level(logging.ERROR, logger="switchboard_todos.listen"):
        assert not listener.subscribe(listen.Doorbell(["default"]), timeout=30)
    listener.stop()
    assert "Set SWITCHBOARD_TODOS_POOLER" in caplog.text


def test_session_mode_listens_past_the_pooler(
    pgbouncer: bouncers.PgBouncer, settings: Any, direct_url: str
) -> None:
    """POOLER = "session" with a LISTEN_URL: the listener connects to the server itself and
    hears what clients of the pooler notify. The old settings, set, win over the pooler's
    defaults: here they turn off what this transaction-mode PgBouncer cannot keep."""
    settings.SWITCHBOARD_TODOS_POOLER = "session"
    settings.SWITCHBOARD_TODOS_LISTEN_URL = direct_url
    settings.SWITCHBOARD_TODOS_PREPARE = False
    settings.SWITCHBOARD_TODOS_GENERIC_PLANS = False
    with through(pgbouncer):
        listener = listen.Listener()
        doorbell = listen.Doorbell(["heard"])
        try:
            assert listener.subscribe(doorbell, timeout=30)
            Todo.objects.create_todo(queue="heard", kind="test.noop")
            assert doorbell.wait(30)
        finally:
            listener.stop()
        assert_nothing_left(pgbouncer, direct_url)
