"""An agent's quota of fails and releases a minute (issue 35: "add a fail-rate quota too, if
measurement shows that bytes alone do not hold the line"). Each fail or release puts a todo back
to be claimed again, and an agent failing its own todos (retry_in 0, errors of 1 KiB, which
its quota of bytes does not count) as fast as it claimed them took nine tenths of the server from
the others. Counted on every surface before anything is written; past it, the todo stays held.
The database's clock stands still in a test's transaction, so the figures are exact."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from django.core.management import call_command
from django.db import connection, connections
from django.test import Client, override_settings

from example_project.mcp_agent import connect
from switchboard_todos import checks
from switchboard_todos.agents import accounts, service
from switchboard_todos.exceptions import Throttled, TodoConflict, TodoNotFound
from switchboard_todos.models import Agent, State, Todo
from switchboard_todos.sqs.signing import secret_for
from tests.asgi import serve_mcp
from tests.helpers import MakeTodo
from tests.test_agent_bytes import a_minute_later, owed
from tests.test_mcp import call, refused

#: The test agents' quota of fails and releases a minute: one each 20 s, all 3 at once (their
#: burst is the whole minute).
QUOTA = 3


def failer(name: str, queue: str = "work") -> tuple[Agent, str]:
    """An agent that claims from and creates in `queue`, and may fail or release QUOTA todos a
    minute, all at once; and its token."""
    agent, token = accounts.create_agent(name, claim_queues=[queue], create_queues=[queue])
    Agent.objects.filter(pk=agent.pk).update(max_fails_per_minute=QUOTA, burst_seconds=60)
    agent.refresh_from_db()
    return agent, token


def failed(agent: Agent) -> int:
    """The fails and releases the agent owes."""
    return owed(agent, "fails_paid_until", QUOTA)


def held(make_todo: MakeTodo, owner: str, count: int) -> list[Todo]:
    return [
        make_todo(
            queue="work", state=State.CLAIMED, owner=owner, lease_expires_in=timedelta(minutes=10)
        )
        for _ in range(count)
    ]


# In the service layer


@pytest.mark.django_db
def test_fails_and_releases_count_and_past_the_quota_nothing_is_written(
    make_todo: MakeTodo, django_assert_num_queries: Any
) -> None:
    agent = failer("f")[0]
    first, second, third, fourth = held(make_todo, "f", 4)
    with django_assert_num_queries(2):  # the quotas' statement, the fail
        service.fail(agent, first.id, "e", retry_in=0)
    service.release(agent, second.id)
    service.fail(agent, third.id, {"why": "x" * 2000})  # its bytes count too
    assert failed(agent) == 3 and owed(agent, "bytes_paid_until", 16 * 1024 * 1024) > 0
    refused_verbs: list[Callable[[], Todo]] = [
        lambda: service.fail(agent, fourth.id, "e"),
        lambda: service.release(agent, fourth.id),
    ]
    for refused_verb in refused_verbs:
        quota = r"quota of 3 a minute \(max_fails_per_minute\)"
        with pytest.raises(Throttled, match=quota) as past:
            refused_verb()
        assert "nothing was written" in str(past.value)
        assert 20 <= past.value.retry_after <= 60  # a turn each: a fail's share of the minute
    kept = Todo.objects.get(pk=fourth.pk)
    assert (kept.state, kept.owner, kept.attempt, kept.errors, kept.lease_expires_at) == (
        State.CLAIMED,
        "f",
        fourth.attempt,
        [],
        fourth.lease_expires_at,
    )
    assert failed(agent) == 3  # the refusals counted nothing
    a_minute_later(agent)
    assert service.fail(agent, fourth.id, "e").state == State.PENDING


@pytest.mark.django_db
def test_the_debt_is_a_fails_share_of_the_minute_by_the_database_clock(
    make_todo: MakeTodo,
) -> None:
    agent = failer("f")[0]
    Agent.objects.filter(pk=agent.pk).update(burst_seconds=20)  # one fail at once
    agent.refresh_from_db()
    first, second = held(make_todo, "f", 2)
    service.release(agent, first.id)
    with pytest.raises(Throttled) as past:
        service.release(agent, second.id)
    assert past.value.retry_after == 20


@pytest.mark.django_db
def test_an_agent_owing_bytes_may_still_fail_with_a_small_error(make_todo: MakeTodo) -> None:
    """A quota the fail adds nothing to does not stop it: a small error is not counted in
    bytes, so the bytes the agent owes (an hour's, after one write larger than its burst) do
    not refuse it; a larger error is refused by them."""
    agent = failer("f")[0]
    first, second = held(make_todo, "f", 2)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todo_agents SET bytes_paid_until = now() + interval '1 hour' WHERE id = %s",
            [agent.pk],
        )
    assert service.fail(agent, first.id, "e" * 500).state == State.PENDING
    with pytest.raises(Throttled, match="more bytes"):
        service.fail(agent, second.id, "e" * 2000)
    assert failed(agent) == 1


@pytest.mark.django_db
def test_a_fail_of_a_todo_the_agent_does_not_hold_counts_too(make_todo: MakeTodo) -> None:
    """A flood of fails of made-up or others' todos is no cheaper than one of its own."""
    agent = failer("f")[0]
    [other] = held(make_todo, "someone-else", 1)
    for todo_id in (other.id, "td_no-such-todo", "td_no-such-todo"):
        with pytest.raises((TodoConflict, TodoNotFound)):
            service.fail(agent, todo_id, "e")
    assert failed(agent) == 3
    with pytest.raises(Throttled):
        service.fail(agent, "td_no-such-todo", "e")


@pytest.mark.django_db
def test_completes_and_heartbeats_do_not_count(make_todo: MakeTodo) -> None:
    agent = failer("f")[0]
    todos = held(make_todo, "f", QUOTA + 1)
    for todo in todos:
        service.heartbeat(agent, todo.id, 60)
        service.complete(agent, todo.id, "ok")
    assert failed(agent) == 0


@pytest.mark.django_db
def test_a_hostile_loop_of_claims_and_fails_is_cut_to_the_quota() -> None:
    """Claim, fail with retry_in 0, claim the same todo again: it stops at the quota, and the
    todo keeps its attempts for later."""
    agent = failer("f")[0]
    service.create_for(agent, queue="work", kind="k", max_attempts=25)
    refused_at = None
    for loop in range(10):
        [todo] = service.claim(agent, ttl=60)
        try:
            service.fail(agent, todo.id, "e" * 1000, retry_in=0)
        except Throttled:
            refused_at = loop
            break
    assert refused_at == QUOTA
    todo = Todo.objects.get()
    assert (todo.state, todo.attempt) == (State.CLAIMED, QUOTA + 1)


@pytest.mark.django_db
def test_an_agent_without_its_own_quota_has_the_setting(make_todo: MakeTodo) -> None:
    agent = accounts.create_agent("plain", claim_queues=["work"])[0]
    todos = held(make_todo, "plain", 3)
    with override_settings(SWITCHBOARD_TODOS_AGENT_MAX_FAILS_PER_MINUTE=20):  # 2 in 6 s
        service.release(agent, todos[0].id)
        service.release(agent, todos[1].id)
        with pytest.raises(Throttled, match="quota of 20 a minute"):
            service.release(agent, todos[2].id)


# Each surface: 429 and Retry-After, an MCP tool error, SQS's throttling error


@pytest.fixture(scope="module")
def base(django_db_setup: None) -> Iterator[str]:
    """The example project under uvicorn: /api, /mcp and /sqs/ on one base URL. The tests on it
    spend their 3 fails at once: the refusals after stay refused for the 20 s the quota takes to
    refill one, whatever the time the requests take."""
    with serve_mcp() as mcp:
        yield mcp.removesuffix("/mcp")


@pytest.mark.django_db(transaction=True)
def test_http_answers_429_past_the_quota_and_the_todo_stays_held(base: str) -> None:
    agent, token = failer("fails-http", queue="fails-http")
    connections.close_all()
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=f"{base}/api", headers=headers, timeout=60) as client:
        for _ in range(QUOTA + 1):
            client.post("/todos/", json={"queue": "fails-http", "kind": "k"})
        todos = client.post("/claim/", json={"ttl": 60, "limit": QUOTA + 1}).json()["todos"]
        answers = [
            client.post(f"/todos/{todo['id']}/fail/", json={"error": "e", "retry_in": 0})
            for todo in todos[:-1]
        ]
        past = client.post(f"/todos/{todos[-1]['id']}/fail/", json={"error": "e"})
        past_release = client.post(f"/todos/{todos[-1]['id']}/release/", json={})
        kept = Todo.objects.get(pk=todos[-1]["id"])
        a_minute_later(agent)
        later = client.post(f"/todos/{todos[-1]['id']}/release/", json={})
    assert [answer.status_code for answer in answers] == [200] * QUOTA
    for refusal in (past, past_release):
        assert refusal.status_code == 429, refusal.text
        assert 20 <= int(refusal.headers["Retry-After"]) <= 60
        assert "max_fails_per_minute" in refusal.json()["detail"]
    assert (kept.state, kept.owner, kept.errors) == (State.CLAIMED, "fails-http", [])
    assert later.status_code == 200 and later.json()["state"] == State.PENDING


@pytest.mark.django_db
def test_djangos_handler_answers_the_same_429(make_todo: MakeTodo) -> None:
    """The API's routes through Django (a project serving Django's application alone)."""
    agent, token = failer("f")
    todos = held(make_todo, "f", QUOTA + 1)
    client = Client(headers={"Authorization": f"Bearer {token}"})
    for todo in todos[:-1]:
        answer = client.post(f"/api/todos/{todo.id}/release/", {}, content_type="application/json")
        assert answer.status_code == 200, answer.content
    past = client.post(f"/api/todos/{todos[-1].id}/release/", {}, content_type="application/json")
    assert past.status_code == 429 and int(past.headers["Retry-After"]) >= 20
    assert Todo.objects.get(pk=todos[-1].id).state == State.CLAIMED


@pytest.mark.django_db(transaction=True)
def test_mcp_answers_a_tool_error_past_the_quota_and_the_todo_stays_held(base: str) -> None:
    agent, token = failer("fails-mcp", queue="fails-mcp")
    connections.close_all()

    async def flood() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with connect(f"{base}/mcp", token) as session:
            for _ in range(QUOTA + 1):
                await call(session, "create_for", queue="fails-mcp", kind="k")
            todos = (await call(session, "claim", ttl=60, limit=QUOTA + 1))["todos"]
            for todo in todos[:-1]:
                await call(session, "fail", todo_id=todo["id"], error="e", retry_in=0)
            return todos, [
                await refused(session, "fail", todo_id=todos[-1]["id"], error="e"),
                await refused(session, "release", todo_id=todos[-1]["id"]),
            ]

    todos, refusals = asyncio.run(flood())
    for problem in refusals:
        assert problem["status"] == 429 and "max_fails_per_minute" in problem["detail"]
        assert "Try again in" in problem["detail"]  # MCP has no Retry-After header
    kept = Todo.objects.get(pk=todos[-1]["id"])
    assert (kept.state, kept.errors) == (State.CLAIMED, [])


@pytest.mark.django_db(transaction=True)
def test_sqs_answers_its_throttling_error_when_a_message_is_given_back_past_the_quota(
    base: str,
) -> None:
    """ChangeMessageVisibility 0 gives a message back (a release); a longer timeout is a
    heartbeat, which does not count."""
    agent, _ = failer("fails-sqs", queue="fails-sqs")
    connections.close_all()
    retries = Config(retries={"total_max_attempts": 1})  # botocore retries throttling
    credentials = {"aws_access_key_id": agent.name, "aws_secret_access_key": secret_for(agent)}
    sqs = boto3.client(
        "sqs", "us-east-1", endpoint_url=f"{base}/sqs/", config=retries, **credentials
    )
    queue = sqs.get_queue_url(QueueName="fails-sqs")["QueueUrl"]
    for n in range(QUOTA + 2):
        sqs.send_message(QueueUrl=queue, MessageBody=f"m{n}")
    received = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=QUOTA + 2)["Messages"]
    assert len(received) == QUOTA + 2
    handles = [message["ReceiptHandle"] for message in received]
    for handle in handles:
        sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle=handle, VisibilityTimeout=60)
    for handle in handles[:QUOTA]:
        sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle=handle, VisibilityTimeout=0)
    with pytest.raises(ClientError) as throttled:
        sqs.change_message_visibility(
            QueueUrl=queue, ReceiptHandle=handles[QUOTA], VisibilityTimeout=0
        )
    error = throttled.value.response["Error"]
    assert error["Code"] == "RequestThrottled" and "max_fails_per_minute" in error["Message"]
    batch = sqs.change_message_visibility_batch(
        QueueUrl=queue,
        Entries=[{"Id": "last", "ReceiptHandle": handles[-1], "VisibilityTimeout": 0}],
    )
    assert [entry["Code"] for entry in batch["Failed"]] == ["RequestThrottled"]
    assert Todo.objects.filter(queue="fails-sqs", state=State.CLAIMED).count() == 2


# Set by the operator


@pytest.mark.django_db
def test_the_quota_is_set_and_reset_by_todo_agent() -> None:
    out = StringIO()
    call_command("todo_agent", "create", "bot", "--max-fails-per-minute", "120", stdout=out)
    assert Agent.objects.get(name="bot").max_fails_per_minute == 120
    assert "max_fails_per_minute 120" in out.getvalue()
    call_command("todo_agent", "limits", "bot", "--max-fails-per-minute", "default", stdout=out)
    assert Agent.objects.get(name="bot").max_fails_per_minute is None
    call_command("todo_agent", "limits", "bot", "--preset", "broker", stdout=out)
    assert Agent.objects.get(name="bot").max_fails_per_minute == 30_000


@pytest.mark.django_db
def test_the_admin_edits_the_quota_and_shows_the_room_left(
    admin_client: Client, make_todo: MakeTodo
) -> None:
    agent = failer("bot", queue="work")[0]
    [todo] = held(make_todo, "bot", 1)
    service.release(agent, todo.id)
    page = f"/admin/switchboard_todos/agent/{agent.pk}/change/"
    shown = admin_client.get(page).content.decode()
    assert "SWITCHBOARD_TODOS_AGENT_MAX_FAILS_PER_MINUTE" in shown
    assert "2 fails or releases" in shown  # of 3 at once
    form = {"claim_queues": "work", "create_queues": "work", "is_active": "on"}
    refused_form = admin_client.post(page, {**form, "max_fails_per_minute": "0"})
    assert refused_form.status_code == 200 and refused_form.context["errors"]
    admin_client.post(page, {**form, "max_fails_per_minute": "1200"})
    assert Agent.objects.get(pk=agent.pk).max_fails_per_minute == 1200


@pytest.mark.parametrize("value", [0, "600", None])
def test_the_setting_is_a_whole_number_of_one_or_more(value: Any) -> None:
    with override_settings(SWITCHBOARD_TODOS_AGENT_MAX_FAILS_PER_MINUTE=value):
        errors = checks.check_settings()
    assert [error.id for error in errors] == ["switchboard_todos.E054"]


@pytest.mark.django_db
def test_the_migration_adds_the_columns_without_a_default() -> None:
    """Nullable, no default: PostgreSQL adds them without rewriting the table."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name, is_nullable, column_default FROM information_schema.columns "
            "WHERE table_name = 'todo_agents' AND column_name LIKE '%fails%' ORDER BY 1"
        )
        assert cursor.fetchall() == [
            ("fails_paid_until", "YES", None),
            ("max_fails_per_minute", "YES", None),
        ]
