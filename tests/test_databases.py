"""Queues in two databases: placement by the router, and every surface operating both.

`eu` is a second database on the test server (tests/settings.py). Here QueueRouter places the
queues `eu-*` in it; everything else lives in `default`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from io import StringIO
from typing import Any

import boto3
import psycopg
import pytest
from botocore.config import Config
from django.contrib.admin.utils import quote
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, connections
from django.db.models import F
from django.db.models.functions import Now
from django.test import Client, override_settings
from psycopg import sql

from switchboard_todos import placement, queue_settings, schedules, stats
from switchboard_todos.agents import accounts, service
from switchboard_todos.agents.serialize import todo_json
from switchboard_todos.checks import check_schema
from switchboard_todos.claims import listen, long_polls
from switchboard_todos.compat import task_backends
from switchboard_todos.exceptions import InvalidTodo, TodoNotFound
from switchboard_todos.models import Event, Queue, Schedule, State, Todo
from switchboard_todos.shutdown import Shutdown
from switchboard_todos.sql import queries
from switchboard_todos.sqs.signing import secret_for
from switchboard_todos.upkeep.reaper import Reaper
from switchboard_todos.worker import Worker
from tests import tasks, worker_handlers  # noqa: F401 (worker_handlers registers handlers)
from tests.asgi import serve
from tests.conftest import database_url
from tests.helpers import CLAIM_STATEMENTS, wait_until
from tests.test_metrics import samples, scrape

PLACED = {"eu-*": "eu"}
BOTH = ["default", "eu"]

pytestmark = pytest.mark.django_db(databases=BOTH)


@pytest.fixture(scope="session", autouse=True)  # once: transactional tests run last, apart
def eu_tables(django_db_setup: None, django_db_blocker: Any) -> None:
    """The app's tables in `eu`, made by its migrations on a live database.

    The test database was migrated before any queue was placed in `eu`: Django then records
    the app's migrations as applied without running them (the router said no), as it would in
    a project that places queues in a database it already had. Recording them as unapplied and
    migrating again is what such a project does.
    """
    with django_db_blocker.unblock(), override_settings(SWITCHBOARD_TODOS_QUEUE_DATABASES=PLACED):
        call_command("migrate", "switchboard_todos", "zero", database="eu", fake=True, verbosity=0)
        call_command("migrate", "switchboard_todos", database="eu", verbosity=0)


@pytest.fixture(autouse=True)
def placed(settings: Any) -> Iterator[None]:
    """Place `eu-*` in `eu`; afterwards empty eu's tables, which a flush without the placement
    would not know to empty."""
    settings.SWITCHBOARD_TODOS_QUEUE_DATABASES = PLACED
    yield
    long_polls.stop()  # the long polls' LISTEN connections and claim threads
    with connections["eu"].cursor() as cursor:
        cursor.execute("TRUNCATE todos, events, todo_schedules, todo_agents, todo_queues")


def ids_in(alias: str) -> set[str]:
    return set(Todo.objects.using(alias).values_list("id", flat=True))


def lapse(alias: str, todo_id: str) -> None:
    Todo.objects.using(alias).filter(pk=todo_id).update(
        lease_expires_at=F("claimed_at") - timedelta(1)
    )


# Placement


def test_the_router_places_queues_and_the_tables_live_in_both() -> None:
    assert placement.database_for("eu-orders") == "eu"
    assert placement.database_for("orders") == "default"
    assert placement.todo_databases() == BOTH
    assert check_schema(databases=BOTH) == []  # the migration check, per database


def test_a_todo_lands_where_its_queue_lives() -> None:
    eu, created = Todo.objects.create_todo(queue="eu-orders", kind="k")
    home, _ = Todo.objects.create_todo(queue="orders", kind="k")
    assert created and eu._state.db == "eu" and home._state.db == "default"
    assert ids_in("eu") == {eu.id} and ids_in("default") == {home.id}


def test_a_batch_of_both_is_split_and_answered_in_order() -> None:
    rows = [{"queue": queue, "kind": "k", "idempotency_key": queue} for queue in PATTERN]
    made = Todo.objects.create_many(rows)
    assert [todo.queue for todo, _ in made] == PATTERN
    assert [todo._state.db for todo, _ in made] == ["eu", "default", "eu", "default"]
    again = Todo.objects.create_many(rows)  # each key found in its own database
    assert [(todo.id, created) for todo, created in again] == [(t.id, False) for t, _ in made]
    assert Todo.objects.enqueue_many([{"queue": q, "kind": "k"} for q in PATTERN]) == 4
    assert len(ids_in("eu")) == len(ids_in("default")) == 4


PATTERN = ["eu-a", "a", "eu-b", "b"]


def test_a_pinned_manager_wins_over_the_placement() -> None:
    todo, _ = Todo.objects.db_manager("eu").create_todo(queue="orders", kind="k")
    assert todo.id in ids_in("eu")
    assert Todo.objects.claim_next("orders", "w", 30) is None  # default has none
    claimed = Todo.objects.db_manager("eu").claim_next("orders", "w", 30)
    assert claimed is not None and claimed.id == todo.id and claimed._state.db == "eu"


class TenantRouter:
    """A project's own router: every todo in the database of the tenant at hand."""

    database = "default"

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self.database if model._meta.app_label == placement.APP_LABEL else None

    db_for_read = db_for_write


def test_a_project_router_of_its_own_is_asked_at_every_call() -> None:
    """The routers' answers are remembered only while every router is a QueueRouter
    (managers/machinery.py, Routes): a project's own may answer differently at the next call,
    for a queue and for a todo by id alike."""
    todo, _ = Todo.objects.create_todo(queue="eu-orders", kind="k")
    try:
        with override_settings(DATABASE_ROUTERS=[f"{__name__}.TenantRouter"]):
            TenantRouter.database = "default"
            assert Todo.objects.claim_next("eu-orders", "w", 30) is None
            TenantRouter.database = "eu"
            claimed = Todo.objects.claim_next("eu-orders", "w", 30)
            assert claimed is not None and claimed.id == todo.id
            TenantRouter.database = "default"
            with pytest.raises(TodoNotFound):
                Todo.objects.complete(todo.id, "w")
            TenantRouter.database = "eu"
            assert Todo.objects.complete(todo.id, "w").state == State.DONE
    finally:
        TenantRouter.database = "default"


def test_a_changed_placement_is_followed_at_the_next_call(settings: Any) -> None:
    """The remembered answers of QueueRouter go with the setting they came from."""
    todo, _ = Todo.objects.create_todo(queue="eu-orders", kind="k")
    assert todo.id in ids_in("eu")
    settings.SWITCHBOARD_TODOS_QUEUE_DATABASES = {}
    assert Todo.objects.claim_next("eu-orders", "w", 30) is None  # default has none
    settings.SWITCHBOARD_TODOS_QUEUE_DATABASES = PLACED
    claimed = Todo.objects.claim_next("eu-orders", "w", 30)
    assert claimed is not None and claimed.id == todo.id


def test_a_pinned_manager_prepares_its_statements_on_its_database() -> None:
    eu = Todo.objects.db_manager("eu")
    for _ in range(6):  # prepared at once; the count shows they were reused, not re-prepared
        todo, _ = eu.create_todo(queue="orders", kind="k")
        eu.claim_next("orders", "w", 30)
        eu.complete(todo.id, "w")
    with connections["eu"].cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        on_eu = [text for (text,) in cursor.fetchall()]
    claims = {queries[name].split("\n", 1)[0] for name in CLAIM_STATEMENTS}
    assert len(on_eu) >= 3 and any(text.split("\n", 1)[0] in claims for text in on_eu)
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        assert cursor.fetchone() == (0,)


@pytest.mark.django_db(transaction=True, databases=BOTH)
def test_a_blocking_claim_waits_on_its_databases_notifications() -> None:
    """With a poll far beyond the wait, only eu's NOTIFY can end the wait with a todo."""
    eu = Todo.objects.db_manager("eu")
    got: list[Todo | None] = []

    def wait() -> None:
        try:
            got.append(eu.claim_next("orders", "w", 30, wait=20))
        finally:
            connections.close_all()

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_until(lambda: listen.shared_listener("eu").listening, "eu's LISTEN")
    started = time.monotonic()
    todo, _ = eu.create_todo(queue="orders", kind="k")
    waiter.join(30)
    assert got and got[0] is not None and got[0].id == todo.id
    assert time.monotonic() - started < 10  # woken, not timed out (20 s)


def test_a_claim_across_databases_is_refused_before_anything_is_claimed() -> None:
    Todo.objects.create_todo(queue="eu-orders", kind="k")
    Todo.objects.create_todo(queue="orders", kind="k")
    with pytest.raises(InvalidTodo, match="different databases .*default: orders; eu: eu-orders"):
        Todo.objects.claim_batch(["orders", "eu-orders"], "w", 30, 10)
    for alias in BOTH:
        assert not Todo.objects.using(alias).filter(state=State.CLAIMED).exists()


def test_an_event_and_its_todos_share_a_database() -> None:
    event, _ = Event.objects.record(source="github", kind="push", payload={})
    with pytest.raises(InvalidTodo, match="event .* is in database 'default'"):
        Todo.objects.create_todo(queue="eu-orders", kind="k", event=event)
    with pytest.raises(InvalidTodo, match="does not exist"):
        Todo.objects.create_todo(queue="eu-orders", kind="k", event=event.id)
    assert ids_in("eu") == set()
    there, _ = Event.objects.db_manager("eu").record(source="github", kind="push", payload={})
    todo, _ = Todo.objects.create_todo(queue="eu-orders", kind="k", event=there)
    assert todo.event_id == there.id and todo._state.db == "eu"


# A todo never moves


def test_every_transition_stays_in_the_todos_database() -> None:
    todo, _ = Todo.objects.create_todo(queue="eu-orders", kind="k", max_attempts=2)
    claimed = Todo.objects.claim_next("eu-orders", "w", 30)
    assert claimed is not None and claimed._state.db == "eu"
    with pytest.raises(TodoNotFound):  # the unpinned manager's database is default
        Todo.objects.complete(todo.id, "w")
    eu = Todo.objects.db_manager("eu")
    assert eu.heartbeat(todo.id, "w", 60).state == State.CLAIMED
    assert eu.fail(todo.id, "w", "boom", retry_in=0).state == State.PENDING
    lapse_claim = eu.claim(todo.id, "w", 30)
    assert lapse_claim.attempt == 2
    assert eu.complete(todo.id, "w", {"ok": 1}).state == State.DONE
    assert ids_in("eu") == {todo.id} and ids_in("default") == set()


@pytest.mark.django_db(transaction=True, databases=BOTH)  # each sweep closes its connections
def test_the_reaper_sweeps_each_database_in_its_own() -> None:
    eu, _ = Todo.objects.create_todo(queue="eu-orders", kind="k")
    home, _ = Todo.objects.create_todo(queue="orders", kind="k")
    Todo.objects.claim_next("eu-orders", "w", 30)
    Todo.objects.claim_next("orders", "w", 30)
    lapse("eu", eu.id)
    lapse("default", home.id)
    with Shutdown() as shutdown:
        swept = Reaper(interval=1, shutdown=shutdown, scheduling=False).sweep()
    assert (swept.requeued, swept.dead_lettered) == (2, 0)
    assert Todo.objects.using("eu").get(pk=eu.id).state == State.PENDING
    assert Todo.objects.using("default").get(pk=home.id).state == State.PENDING
    assert ids_in("eu") == {eu.id} and ids_in("default") == {home.id}


@pytest.mark.django_db(transaction=True, databases=BOTH)  # each sweep closes its connections
def test_a_queues_settings_live_beside_its_todos_and_apply_there() -> None:
    """Its row is in its database; its todos' default attempts and retention are read there."""
    queue_settings.configure("eu-orders", max_attempts=2, retention=timedelta(days=1))
    assert Queue.objects.using("eu").get().name == "eu-orders"
    assert not Queue.objects.using("default").exists()
    todo, _ = Todo.objects.create_todo(queue="eu-orders", kind="k")
    assert todo.max_attempts == 2
    assert Todo.objects.enqueue_many([{"queue": "eu-orders", "kind": "bulk"}]) == 1
    assert Todo.objects.using("eu").get(kind="bulk").max_attempts == 2
    Todo.objects.using("eu").update(
        state=State.DONE,
        created_at=F("created_at") - timedelta(2),
        completed_at=Now() - timedelta(2),
    )
    with Shutdown() as shutdown:
        swept = Reaper(interval=1, shutdown=shutdown, scheduling=False).sweep()
    assert swept.purged == 2 and ids_in("eu") == set()
    (view,) = queue_settings.overview(using="eu")
    assert (view.name, view.database, view.retention_text) == ("eu-orders", "eu", "1d")


def test_a_schedule_lives_beside_its_queue(settings: Any) -> None:
    schedules.declare("eu-census", "* * * * *", kind="census", queue="eu-reports")
    try:
        with connections["eu"].cursor() as cursor:
            cursor.execute("SELECT now()")
            (now,) = cursor.fetchone()
        assert schedules.run_due(using="default", now=now).enqueued == 0
        assert not Schedule.objects.using("default").exists()
        schedules.run_due(using="eu", now=now)
        schedules.run_due(using="eu", now=now + timedelta(minutes=1))
        assert Schedule.objects.using("eu").get().name == "eu-census"
        assert Todo.objects.using("eu").get().queue == "eu-reports"
    finally:
        schedules.forget("eu-census")


# One worker fleet


@pytest.mark.django_db(transaction=True, databases=BOTH)
@pytest.mark.parametrize("queues", [["orders", "eu-orders"], ["*"]])
def test_one_worker_drains_both_databases(queues: list[str]) -> None:
    for queue in ("orders", "eu-orders"):
        Todo.objects.enqueue_many([{"queue": queue, "kind": "test.noop"}] * 150)
    stats_ = Worker(queues, concurrency=4, max_todos=300, batch_size=20).run()
    assert (stats_.claimed, stats_.done, stats_.failed) == (300, 300, 0)
    for alias in BOTH:
        rows = Todo.objects.using(alias).values_list("state", "attempt").distinct()
        assert list(rows) == [(State.DONE, 1)], alias
        assert Todo.objects.using(alias).count() == 150


@pytest.mark.django_db(transaction=True, databases=BOTH)
def test_a_notification_in_either_database_wakes_the_worker() -> None:
    worker = Worker(["orders", "eu-orders"], poll_interval=60, max_todos=2)
    assert worker.databases == BOTH
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(
            lambda: (
                len(worker._listeners) == 2 and all(each.listening for each in worker._listeners)
            ),
            "LISTEN",
        )
        for queue in ("eu-orders", "orders"):
            todo, _ = Todo.objects.create_todo(queue=queue, kind="test.noop")
            done = Todo.objects.using(todo._state.db).filter(pk=todo.pk, state=State.DONE)
            wait_until(done.exists, f"the todo of {queue} done without polling", timeout=10)
    finally:
        worker.stop()
        thread.join(60)


@contextmanager
def eu_down() -> Iterator[None]:
    """The `eu` database refuses connections, and its sessions are ended, until the block ends."""
    name = connections["eu"].settings_dict["NAME"]
    maintenance = database_url().rsplit("/", 1)[0] + "/postgres"

    def allow(on: bool) -> None:
        with psycopg.connect(maintenance, autocommit=True) as admin:
            admin.execute(
                sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}").format(
                    sql.Identifier(name), sql.SQL("true" if on else "false")
                )
            )
            if not on:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                    [name],
                )

    allow(False)
    try:
        yield
    finally:
        allow(True)
        connections["eu"].close()  # this thread's, ended with the others


@pytest.mark.django_db(transaction=True, databases=BOTH)
def test_a_database_that_is_down_stops_neither_the_worker_nor_the_others_queues() -> None:
    for queue in ("orders", "eu-orders"):
        Todo.objects.enqueue_many([{"queue": queue, "kind": "test.noop"}] * 20)
    worker = Worker(["orders", "eu-orders"], concurrency=2, poll_interval=0.1)
    thread = threading.Thread(target=worker.run)
    try:
        with eu_down():
            thread.start()
            wait_until(lambda: worker.stats.done >= 20, "the default database's todos done")
            home = Todo.objects.using("default").values_list("state", flat=True).distinct()
            assert list(home) == [State.DONE] and worker.stats.done == 20
        wait_until(lambda: worker.stats.done == 40, "eu's todos done once it is back")
    finally:
        worker.stop()
        thread.join(60)
    assert list(Todo.objects.using("eu").values_list("state", "attempt").distinct()) == [
        (State.DONE, 1)
    ]


@pytest.mark.django_db(transaction=True, databases=BOTH)
def test_a_sweep_reaps_the_databases_that_are_up_and_then_reports_the_one_down() -> None:
    for queue in ("orders", "eu-orders"):
        todo, _ = Todo.objects.create_todo(queue=queue, kind="k")
        Todo.objects.claim_next(queue, "w", 30)
        lapse(placement.database_for(queue), todo.id)
    with Shutdown() as shutdown:
        reaper = Reaper(interval=1, shutdown=shutdown, scheduling=False)
        with eu_down(), pytest.raises(OperationalError):
            reaper.sweep()
        home = Todo.objects.using("default").get(queue="orders")
        assert home.state == State.PENDING  # swept, although eu was down
        assert reaper.sweep().requeued == 1  # eu, back


def test_a_worker_told_one_database_refuses_a_queue_of_another() -> None:
    with pytest.raises(InvalidTodo, match="'orders' lives in database 'default'"):
        Worker(["orders", "eu-orders"], databases=["eu"])
    assert Worker(["*"], databases=["eu"]).databases == ["eu"]


# Operators


def test_todo_stats_reports_each_database() -> None:
    Todo.objects.create_todo(queue="eu-orders", kind="k")
    Todo.objects.create_todo(queue="orders", kind="k")
    out = run("todo_stats")
    assert "Database 'default':" in out and "Database 'eu':" in out
    report = json.loads(run("todo_stats", "--json"))
    assert {(row["database"], row["queue"]) for row in report["queues"]} == {
        ("default", "orders"),
        ("eu", "eu-orders"),
    }
    assert set(report["databases"]) == set(BOTH)
    only = json.loads(run("todo_stats", "--json", "--database", "eu"))
    assert [row["queue"] for row in only["queues"]] == ["eu-orders"]
    with pytest.raises(CommandError, match="--database 'nowhere': not a database"):
        run("todo_stats", "--database", "nowhere")


@pytest.mark.django_db(transaction=True, databases=BOTH)
def test_purge_and_reap_commands_cover_each_database() -> None:
    for queue in ("orders", "eu-orders"):
        todo, _ = Todo.objects.create_todo(queue=queue, kind="k")
        alias = placement.database_for(queue)
        Todo.objects.claim_next(queue, "w", 30)
        Todo.objects.db_manager(alias).complete(todo.id, "w")
        Todo.objects.using(alias).filter(pk=todo.id).update(
            completed_at=F("completed_at") - timedelta(2)
        )
    assert "Would delete 2 done todos" in run("purge_todos", "--older-than", "1d", "--dry-run")
    assert "Deleted 1 done todo" in run("purge_todos", "--older-than", "1d", "--database", "eu")
    assert ids_in("eu") == set() and len(ids_in("default")) == 1
    assert "0 requeued" in run("reap_todos", "--no-schedules")


def test_the_metrics_give_each_databases_queues_and_vacuum(client: Client, settings: Any) -> None:
    Todo.objects.create_todo(queue="eu-orders", kind="k")
    found = samples(scrape(client, settings))
    assert found["switchboard_todos_todos", (("queue", "eu-orders"), ("state", "ready"))] == 1
    for alias in BOTH:
        assert found["switchboard_todos_table_live_tuples", (("database", alias),)] >= 0


def test_the_admin_lists_and_repairs_each_database(admin_client: Client) -> None:
    eu, _ = Todo.objects.create_todo(queue="eu-orders", kind="k", max_attempts=1)
    Todo.objects.claim_next("eu-orders", "w", 30)
    Todo.objects.db_manager("eu").fail(eu.id, "w", "boom")
    home, _ = Todo.objects.create_todo(queue="orders", kind="k")
    changelist = "/admin/switchboard_todos/todo/"
    listed = admin_client.get(changelist).content.decode()
    assert home.id in listed and eu.id not in listed
    listed = admin_client.get(changelist + "?database=eu").content.decode()
    assert eu.id in listed and home.id not in listed and "?database=default" in listed
    # The admin quotes ids in URLs: "td_23…" would otherwise read as "td#…".
    response = admin_client.get(
        f"{changelist}{quote(eu.id)}/change/?_changelist_filters=database%3Deu"
    )
    assert response.status_code == 200, (response.status_code, response.get("Location"))
    page = response.content.decode()
    assert f"{changelist}?database=eu&amp;q={eu.id}" in page  # its repair buttons stay in eu
    response = admin_client.post(
        f"{changelist}?database=eu",
        {"action": "requeue_selected", "_selected_action": [eu.id], "index": 0},
    )
    assert response.status_code == 302
    assert Todo.objects.using("eu").get(pk=eu.id).state == State.PENDING
    assert admin_client.get(changelist + "?database=nowhere").status_code == 404
    health = admin_client.get(changelist + "health/?database=eu").content.decode()
    assert "Databases" in health and "eu-orders" in health and 'href="?database=default"' in health


def test_a_plan_lives_in_its_queues_database_with_its_parents(admin_client: Client) -> None:
    """An agent's plan waits for todos of its database; one of another database is unknown
    there. The merge reads its parts' results there, and its graph links stay there."""
    agent, _ = accounts.create_agent(
        "planner", claim_queues=["eu-orders"], create_queues=["eu-orders"]
    )
    fetch, _ = Todo.objects.create_todo(queue="eu-orders", kind="fetch")
    home, _ = Todo.objects.create_todo(queue="orders", kind="k")
    with pytest.raises(TodoNotFound):
        service.create_for(agent, queue="eu-orders", kind="k", after=[home.id])
    [(part, _), (merge, _)] = service.create_many_for(
        agent,
        todos=[
            {"queue": "eu-orders", "kind": "part", "ref": "part", "after": [fetch.id]},
            {"queue": "eu-orders", "kind": "merge", "after": ["part"]},
        ],
    )
    assert {part.id, merge.id} <= ids_in("eu")
    eu = Todo.objects.db_manager("eu")
    for todo in (fetch, part):
        eu.claim(todo.id, "w", 30)
        eu.complete(todo.id, "w", todo.kind)
    assert todo_json(eu.get(pk=merge.id))["parent_results"] == {part.id: "part"}
    changelist = "/admin/switchboard_todos/todo/"
    page = admin_client.get(f"{changelist}{quote(part.id)}/change/?database=eu").content.decode()
    for relative in (fetch, merge):
        assert f'href="{changelist}{quote(relative.id)}/change/?database=eu"' in page


def test_the_queues_page_shows_and_steers_each_database(admin_client: Client) -> None:
    Todo.objects.create_todo(queue="eu-orders", kind="k")
    Todo.objects.create_todo(queue="orders", kind="k")
    queues = "/admin/switchboard_todos/queue/"
    assert [row.view.name for row in admin_client.get(queues).context["rows"]] == ["orders"]
    page = admin_client.get(queues + "?database=eu")
    assert [row.view.name for row in page.context["rows"]] == ["eu-orders"]
    assert "?database=eu&amp;queue=eu-orders" in page.content.decode()
    admin_client.post(
        queues + "?database=eu",
        {"action": "pause_selected", "_selected_action": ["eu-orders"], "index": "0"},
    )
    assert Queue.objects.using("eu").get().paused
    admin_client.post(queues + "eu-orders/change/", {"max_attempts": "4", "description": ""})
    assert Queue.objects.using("eu").get().max_attempts == 4
    assert not Queue.objects.using("default").exists()


def test_an_agent_works_queues_of_both_databases() -> None:
    agent, _ = accounts.create_agent("a1", claim_queues=["orders", "eu-orders"])
    eu, _ = Todo.objects.create_todo(queue="eu-orders", kind="k")
    home, _ = Todo.objects.create_todo(queue="orders", kind="k")
    assert {todo.id for todo in service.list_todos(agent).todos} == {eu.id, home.id}
    assert service.get_todo(agent, eu.id).id == eu.id
    claimed = service.claim(agent, ttl=30, limit=10)
    assert {todo.id for todo in claimed} == {eu.id, home.id}
    assert service.complete(agent, eu.id, {"ok": 1}).state == State.DONE
    assert service.heartbeat(agent, home.id, 30).state == State.CLAIMED
    with pytest.raises(TodoNotFound):
        service.complete(agent, "td_unknown", None)
    assert service.claim(agent, ttl=30, wait=0.2) == []  # waited in each database, found none


def test_the_tasks_backend_enqueues_where_the_queue_lives_and_finds_the_result(
    settings: Any,
) -> None:
    settings.TASKS = {
        "default": {
            "BACKEND": "switchboard_todos.backends.TodoBackend",
            "QUEUES": ["default", "eu-tasks"],
        }
    }
    result = tasks.add.using(queue_name="eu-tasks").enqueue(1, 2)
    assert ids_in("eu") == {result.id} and ids_in("default") == set()
    assert task_backends["default"].get_result(result.id).args == [1, 2]
    home = tasks.add.enqueue(3, 4)
    assert task_backends["default"].get_result(home.id).kwargs == {}
    assert ids_in("default") == {home.id}


@pytest.mark.django_db(transaction=True, databases=BOTH)
def test_an_sqs_client_works_a_queue_of_the_second_database(subprocess_env: dict[str, str]) -> None:
    agent = accounts.create_agent("sqs-eu", claim_queues=["eu-jobs"], create_queues=["eu-jobs"])[0]
    env = {
        **subprocess_env,
        "SWITCHBOARD_TODOS_QUEUE_DATABASES": json.dumps(PLACED),
        "DATABASE_POOL_SIZE": "4",
    }
    with serve(env) as (api, process):
        sqs = boto3.client(
            "sqs",
            endpoint_url=api.removesuffix("/api") + "/sqs/",
            region_name="us-east-1",
            aws_access_key_id=agent.name,
            aws_secret_access_key=secret_for(agent),
            config=Config(retries={"max_attempts": 1}),
        )
        queue = sqs.get_queue_url(QueueName="eu-jobs")["QueueUrl"]
        sent = [sqs.send_message(QueueUrl=queue, MessageBody=f"m{n}")["MessageId"] for n in (1, 2)]
        assert ids_in("eu") == set(sent) and ids_in("default") == set()
        counts = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"]
        assert counts["ApproximateNumberOfMessages"] == "2"
        received = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]
        assert {message["MessageId"] for message in received} == set(sent)
        first, second = received
        sqs.delete_message(QueueUrl=queue, ReceiptHandle=first["ReceiptHandle"])
        sqs.change_message_visibility(
            QueueUrl=queue, ReceiptHandle=second["ReceiptHandle"], VisibilityTimeout=0
        )
        process.terminate()
        output = process.communicate(timeout=30)[0]
    assert "Traceback" not in output, output
    states = dict(Todo.objects.using("eu").values_list("id", "state"))
    assert states == {first["MessageId"]: State.DONE, second["MessageId"]: State.PENDING}


def test_queue_health_reads_the_database_asked() -> None:
    Todo.objects.create_todo(queue="eu-orders", kind="k")
    assert [row.queue for row in stats.queue_health(using="eu")] == ["eu-orders"]
    assert stats.queue_health(using="default") == []


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()
