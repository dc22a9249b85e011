"""Every request is a tenant's cost (issue 35): an agent's quota of bytes of JSON a minute, on
every surface, and creates and plans that count as far as the database went for them, the
checks that need no write made before any row is written or locked."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import boto3
import httpx
import psycopg
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from django.core.management import call_command
from django.db import OperationalError, connection, connections
from django.test import Client, override_settings

from example_project.mcp_agent import connect
from switchboard_todos import checks
from switchboard_todos.agents import accounts, service
from switchboard_todos.agents.service.quotas import UNCOUNTED_BYTES
from switchboard_todos.exceptions import InvalidTodo, Throttled, TodoConflict, TodoNotFound
from switchboard_todos.models import Agent, State, Todo
from switchboard_todos.sqs.signing import secret_for
from tests.asgi import serve_mcp
from tests.conftest import database_url
from tests.helpers import MakeTodo, db_now
from tests.test_mcp import call, refused

#: The test agents' quota of bytes a minute.
QUOTA = 4000


def of(size: int) -> dict[str, str]:
    """A JSON object of exactly `size` bytes as the service stores it."""
    return {"x": "a" * (size - len('{"x":""}'))}


def written(agent: Agent) -> int:
    """The bytes the agent owes (paid for ahead of the database's clock, which stands still
    in a test's transaction)."""
    return owed(agent, "bytes_paid_until", QUOTA)


def created(agent: Agent) -> int:
    """The creations the agent owes, at the default quota of 600 a minute."""
    return owed(agent, "creates_paid_until", 600)


def owed(agent: Agent, column: str, quota: int) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT round(coalesce(greatest(extract(epoch FROM {column} - now()), 0), 0) "
            "* %s / 60) FROM todo_agents WHERE id = %s",
            [quota, agent.pk],
        )
        return int(cursor.fetchone()[0])


def a_minute_later(agent: Agent) -> None:
    """Let the agent owe nothing, as a minute later: its paced quotas paid up to the database's
    clock in its row."""
    with connection.cursor() as cursor:  # now(), as count_writes reads it; Now() is the statement's
        cursor.execute(
            "UPDATE todo_agents SET bytes_paid_until = now(), creates_paid_until = now(), "
            "fails_paid_until = now() WHERE id = %s",
            [agent.pk],
        )


def writer(name: str, queue: str = "work") -> tuple[Agent, str]:
    """An agent that claims from and creates in `queue` (and creates in `handoff`, which it
    cannot see), and may write QUOTA bytes a minute, a whole minute's worth at once (its burst:
    test_agent_pacing.py paces); and its token."""
    agent, token = accounts.create_agent(
        name, claim_queues=[queue], create_queues=[queue, "handoff"]
    )
    Agent.objects.filter(pk=agent.pk).update(max_bytes_per_minute=QUOTA, burst_seconds=60)
    agent.refresh_from_db()
    return agent, token


# The quota of bytes, in the service layer


@pytest.mark.django_db
def test_payloads_count_in_the_statement_that_counts_the_creates(
    django_assert_num_queries: Any,
) -> None:
    agent = writer("w")[0]
    with django_assert_num_queries(4):  # savepoint, the quotas' statement, the insert, release
        service.create_for(agent, queue="work", kind="k", payload=of(1000))
    service.create_many_for(
        agent, todos=[{"queue": "work", "kind": "k", "payload": of(1000)} for _ in range(2)]
    )
    assert (written(agent), created(agent)) == (3000, 3)
    with pytest.raises(Throttled, match="quota of 4000 bytes of JSON a minute") as past:
        service.create_for(agent, queue="work", kind="k", payload=of(1001))
    assert "nothing was written" in str(past.value) and 1 <= past.value.retry_after <= 60
    assert (written(agent), created(agent), Todo.objects.count()) == (3000, 3, 3)
    a_minute_later(agent)
    service.create_for(agent, queue="work", kind="k", payload=of(1001))
    assert (written(agent), created(agent)) == (1001, 1)  # new windows


@pytest.mark.django_db
def test_the_debt_is_kept_by_the_database_clock() -> None:
    agent = writer("w")[0]
    service.create_for(agent, queue="work", kind="k", payload=of(3000))
    paid = Agent.objects.get(pk=agent.pk).bytes_paid_until
    assert paid == db_now() + timedelta(seconds=45)  # 3000 of 4000 a minute, from its now()
    with pytest.raises(Throttled) as past:
        service.create_for(agent, queue="work", kind="k", payload=of(2000))
    assert past.value.retry_after == 15  # until 1000 more bytes have refilled


@pytest.mark.django_db
def test_results_errors_and_progress_count_past_their_first_kib(
    make_todo: MakeTodo, django_assert_num_queries: Any
) -> None:
    """Written by the holder's verbs, as stored; a refused one changes nothing at all."""
    agent = writer("w")[0]
    first, second, third = (
        make_todo(
            queue="work", state=State.CLAIMED, owner="w", lease_expires_in=timedelta(minutes=10)
        )
        for _ in range(3)
    )
    with django_assert_num_queries(1):  # not counted: no statement more
        service.heartbeat(agent, first.id, 30, progress=of(UNCOUNTED_BYTES))
    assert written(agent) == 0
    service.heartbeat(agent, first.id, 30, progress=of(2000))
    service.fail(agent, first.id, "m" * (1500 - len('{"type":"","message":""}')))
    assert written(agent) == 3500
    before = Todo.objects.get(pk=second.pk)
    for verb, arguments in (
        (service.complete, {"result": of(1100)}),
        (service.fail, {"error": "e" * 2000}),
        (service.heartbeat, {"ttl": 3600, "progress": of(1100)}),
    ):
        with pytest.raises(Throttled, match="no room for [0-9]+ more bytes.*nothing was written"):
            verb(agent, second.id, **arguments)
    after = Todo.objects.get(pk=second.pk)
    assert (after.state, after.result, after.errors, after.progress, after.lease_expires_at) == (
        before.state,
        before.result,
        before.errors,
        before.progress,
        before.lease_expires_at,
    )
    assert written(agent) == 3500
    a_minute_later(agent)
    assert service.complete(agent, second.id, of(1100)).result == of(1100)
    assert service.complete(agent, third.id, of(1100)).state == State.DONE
    assert written(agent) == 2200


@pytest.mark.django_db
def test_one_write_larger_than_the_whole_quota_is_invalid(make_todo: MakeTodo) -> None:
    """Waiting would never let it through: 422, not 429."""
    agent = writer("w")[0]
    held = make_todo(queue="work", state=State.CLAIMED, owner="w")
    with pytest.raises(InvalidTodo, match="4001 bytes of JSON are more than agent 'w' may write"):
        service.create_for(agent, queue="work", kind="k", payload=of(QUOTA + 1))
    with pytest.raises(InvalidTodo, match="max_bytes_per_minute 4000"):
        service.complete(agent, held.id, of(QUOTA + 1))
    assert (written(agent), created(agent), Todo.objects.count()) == (0, 0, 1)


@pytest.mark.django_db
@override_settings(SWITCHBOARD_TODOS_AGENT_MAX_BYTES_PER_MINUTE=5000)
def test_an_agent_without_its_own_quota_has_the_setting() -> None:
    agent = accounts.create_agent("w", create_queues=["work"])[0]
    service.create_for(agent, queue="work", kind="k", payload=of(5000))
    with pytest.raises(Throttled, match="quota of 5000 bytes"):
        service.create_for(agent, queue="work", kind="k")


# Refused creates and plans count as far as the database went


def keyed_plan(attempt: int) -> list[dict[str, Any]]:
    """Ten todos: nine parts, and a merge that waits for them with the agent's key `held`."""
    parts = [
        {"queue": "work", "kind": "part", "ref": f"p{n}", "idempotency_key": f"{attempt}-{n}"}
        for n in range(9)
    ]
    merge = {"queue": "work", "kind": "merge", "after": [f"p{n}" for n in range(9)]}
    return [*parts, {**merge, "idempotency_key": "held"}]


def inserted_here() -> int:
    """Rows this transaction inserted into todos so far, those rolled back included."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_get_xact_tuples_inserted('todos'::regclass)")
        return int(cursor.fetchone()[0])


@pytest.mark.django_db
def test_plans_refused_for_a_held_key_use_the_quota_and_write_no_row() -> None:
    """60 plans of 10 refused 409 by one held key fill the quota of 600 creations a minute: the
    61st is throttled. Each was refused by a read, before the plan's rows were inserted (and
    rolled back) or its parents locked."""
    agent = writer("w")[0]
    Todo.objects.create_todo(queue="work", kind="k", idempotency_key="agent:w/held")
    before = inserted_here()
    for attempt in range(60):
        with pytest.raises(TodoConflict, match="'held' of this plan.*nothing was created"):
            service.create_many_for(agent, todos=keyed_plan(attempt))
    assert created(agent) == 600
    with pytest.raises(Throttled, match="quota of 600 todos a minute"):
        service.create_many_for(agent, todos=keyed_plan(60))
    assert inserted_here() == before and Todo.objects.count() == 1


@pytest.mark.django_db
def test_a_plan_whose_keys_are_all_held_answers_its_todos() -> None:
    """Sent again, the plan finds every todo by its key: counted, nothing refused."""
    agent = writer("w")[0]
    first = service.create_many_for(agent, todos=keyed_plan(0)[:-1])
    again = service.create_many_for(agent, todos=keyed_plan(0)[:-1])
    assert [todo for todo, _ in again] == [todo for todo, _ in first]
    assert not any(made for _, made in again) and created(agent) == 18


@pytest.mark.django_db
def test_a_create_refused_for_a_key_it_may_not_see_counts() -> None:
    """The statement ran and found the key's live todo: counted as a create, todos and bytes."""
    agent = writer("w")[0]
    service.create_for(agent, queue="handoff", kind="k", idempotency_key="k", payload=of(100))
    with pytest.raises(TodoConflict, match="'k' is taken in queue 'handoff'"):
        service.create_for(agent, queue="handoff", kind="k", idempotency_key="k", payload=of(100))
    assert (created(agent), written(agent), Todo.objects.count()) == (2, 200, 1)


@pytest.mark.django_db(transaction=True)
def test_a_plan_naming_a_dead_or_missing_parent_waits_for_no_parents_lock() -> None:
    """Another session holds a live parent's row locked: the plan naming it beside a dead letter
    (or an unknown id) is refused while that lock is still held, by the read that checks what
    the agent may wait for. Refused there, it is counted: the database read for it. The test's
    connection gives up on any lock wait after 5 s (a failure, not a pause). The database's
    clock runs on here (no test transaction): at 6 creations a minute, each is owed for 10 s,
    and the count reads the same for any time the test takes under 5 s."""
    agent = writer("w")[0]
    Agent.objects.filter(pk=agent.pk).update(max_creates_per_minute=6)
    agent.refresh_from_db()
    live, dead = (Todo.objects.create_todo(queue="work", kind="k")[0] for _ in range(2))
    Todo.objects.filter(pk=dead.pk).update(state=State.FAILED)
    refusals = []
    with psycopg.connect(database_url(), autocommit=True) as other, other.transaction():
        other.execute("SELECT 1 FROM todos WHERE id = %s FOR NO KEY UPDATE", [live.id])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '5s'")
        try:
            for create, error in (
                (lambda: service.create_many_for(
                    agent, todos=[{"queue": "work", "kind": "k", "after": [live.id, dead.id]}]
                ), InvalidTodo),
                (lambda: service.create_for(
                    agent, queue="work", kind="k", after=[live.id, dead.id]
                ), InvalidTodo),
                (lambda: service.create_for(
                    agent, queue="work", kind="k", after=[live.id, "td_nope"]
                ), TodoNotFound),
            ):  # fmt: skip
                with pytest.raises(error) as refused_plan:
                    create()
                refusals.append(str(refused_plan.value))
            with pytest.raises(OperationalError), connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM todos WHERE id = %s FOR UPDATE NOWAIT", [live.id])
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
    assert (
        refusals[0]
        == refusals[1]
        == (f"after: todo {dead.id!r} is a dead letter; requeue it before waiting for it.")
    )
    assert owed(agent, "creates_paid_until", 6) == 3 and Todo.objects.count() == 2


# Each surface: 429 and Retry-After, SQS's throttling error, an MCP tool error


@pytest.fixture(scope="module")
def base(django_db_setup: None) -> Iterator[str]:
    """The example project under uvicorn: /api, /mcp and /sqs/ on one base URL. The tests on it
    first write 3,900 of their 4,000 bytes a minute: the refusals after stay refused for the
    15 s the quota takes to refill 1,000 bytes, whatever the time the requests take."""
    with serve_mcp() as mcp:
        yield mcp.removesuffix("/mcp")


@pytest.mark.django_db(transaction=True)
def test_http_answers_429_past_the_byte_quota_and_writes_nothing(base: str) -> None:
    agent, token = writer("bytes-http", queue="bytes")
    connections.close_all()
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=f"{base}/api", headers=headers, timeout=60) as client:
        made = client.post("/todos/", json={"queue": "bytes", "kind": "k", "payload": of(3900)})
        past = client.post("/todos/", json={"queue": "bytes", "kind": "k", "payload": of(1001)})
        [todo] = client.post("/claim/", json={"ttl": 60}).json()["todos"]
        unfinished = client.post(f"/todos/{todo['id']}/complete/", json={"result": of(1100)})
        held = Todo.objects.get(pk=todo["id"])
        a_minute_later(agent)
        finished = client.post(f"/todos/{todo['id']}/complete/", json={"result": of(1100)})
    assert made.status_code == 201
    for refusal in (past, unfinished):
        assert refusal.status_code == 429, refusal.text
        assert 1 <= int(refusal.headers["Retry-After"]) <= 60
        assert "bytes of JSON a minute" in refusal.json()["detail"]
    assert (held.state, held.result) == (State.CLAIMED, None)
    assert finished.status_code == 200 and finished.json()["result"] == of(1100)
    assert Todo.objects.filter(queue="bytes").count() == 1


@pytest.mark.django_db(transaction=True)
def test_mcp_answers_a_tool_error_past_the_byte_quota_and_writes_nothing(base: str) -> None:
    agent, token = writer("bytes-mcp", queue="bytes")
    connections.close_all()

    async def flood() -> tuple[str, list[dict[str, Any]]]:
        async with connect(f"{base}/mcp", token) as session:
            await call(session, "create_for", queue="bytes", kind="k", payload=of(3900))
            [todo] = (await call(session, "claim", ttl=60))["todos"]
            return todo["id"], [
                await refused(session, "fail", todo_id=todo["id"], error="e" * 1100),
                await refused(session, "create_for", queue="bytes", kind="k", payload=of(1001)),
            ]

    async def fail(todo_id: str) -> dict[str, Any]:
        async with connect(f"{base}/mcp", token) as session:
            return await call(session, "fail", todo_id=todo_id, error="e" * 1100)

    todo_id, refusals = asyncio.run(flood())
    held = Todo.objects.get(pk=todo_id)
    a_minute_later(agent)
    failed = asyncio.run(fail(todo_id))
    for problem in refusals:
        assert problem["status"] == 429 and "bytes of JSON a minute" in problem["detail"]
        assert "Try again in" in problem["detail"]  # MCP has no Retry-After header
    assert (held.state, held.errors) == (State.CLAIMED, [])
    assert failed["state"] == State.PENDING and Todo.objects.filter(queue="bytes").count() == 1


@pytest.mark.django_db(transaction=True)
def test_sqs_answers_its_throttling_error_past_the_byte_quota_and_writes_nothing(
    base: str,
) -> None:
    """A message's payload is its body and attributes: {"body": …, "attributes": {}}."""
    agent, _ = writer("bytes-sqs", queue="bytes")
    connections.close_all()
    retries = Config(retries={"total_max_attempts": 1})  # botocore retries throttling
    credentials = {"aws_access_key_id": agent.name, "aws_secret_access_key": secret_for(agent)}
    sqs = boto3.client(
        "sqs", "us-east-1", endpoint_url=f"{base}/sqs/", config=retries, **credentials
    )
    queue = sqs.get_queue_url(QueueName="bytes")["QueueUrl"]
    sqs.send_message(QueueUrl=queue, MessageBody="m" * 3900)
    with pytest.raises(ClientError) as throttled:
        sqs.send_message(QueueUrl=queue, MessageBody="m" * 1000)
    error = throttled.value.response["Error"]
    assert error["Code"] == "RequestThrottled" and "bytes of JSON a minute" in error["Message"]
    assert Todo.objects.filter(queue="bytes").count() == 1
    a_minute_later(agent)
    sqs.send_message(QueueUrl=queue, MessageBody="m" * 1000)
    assert Todo.objects.filter(queue="bytes").count() == 2


# Set by the operator


@pytest.mark.django_db
def test_the_quota_is_set_and_reset_by_todo_agent() -> None:
    out = StringIO()
    call_command("todo_agent", "create", "bot", "--max-bytes-per-minute", "65536", stdout=out)
    assert Agent.objects.get(name="bot").max_bytes_per_minute == 65536
    assert "max_bytes_per_minute 65536" in out.getvalue()
    call_command("todo_agent", "limits", "bot", "--max-bytes-per-minute", "default", stdout=out)
    assert Agent.objects.get(name="bot").max_bytes_per_minute is None


@pytest.mark.django_db
def test_the_quota_is_edited_in_the_admin_and_at_least_one(admin_client: Client) -> None:
    agent = accounts.create_agent("bot", claim_queues=["work"])[0]
    page = f"/admin/switchboard_todos/agent/{agent.pk}/change/"
    form = {"claim_queues": "work", "create_queues": "", "is_active": "on"}
    assert "SWITCHBOARD_TODOS_AGENT_MAX_BYTES_PER_MINUTE" in admin_client.get(page).content.decode()
    refused_form = admin_client.post(page, {**form, "max_bytes_per_minute": "0"})
    assert refused_form.status_code == 200 and refused_form.context["errors"]
    admin_client.post(page, {**form, "max_bytes_per_minute": "1048576"})
    assert Agent.objects.get(pk=agent.pk).max_bytes_per_minute == 1048576


@pytest.mark.parametrize("value", [0, "16M", None])
def test_the_setting_is_a_whole_number_of_one_or_more(value: Any) -> None:
    with override_settings(SWITCHBOARD_TODOS_AGENT_MAX_BYTES_PER_MINUTE=value):
        errors = checks.check_settings()
    assert [error.id for error in errors] == ["switchboard_todos.E026"]
