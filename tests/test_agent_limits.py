"""What one agent may take (held todos, creations per minute, attempts per todo), and that its
keys are its own: it can neither squat a producer's idempotency key nor block a concurrency key
it cannot see, and no conflict names a todo it may not see. The service layer; the surfaces
are tried against live servers in test_api_live.py, test_sqs.py and test_mcp.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from switchboard_todos.agents import accounts, service
from switchboard_todos.agents.serialize import todo_json
from switchboard_todos.exceptions import InvalidTodo, Throttled, TodoConflict
from switchboard_todos.models import Agent, State, Todo
from tests.conftest import run_in_threads
from tests.helpers import MakeTodo

pytestmark = pytest.mark.django_db


@pytest.fixture
def agent() -> Agent:
    """Agent `a1`: claims from `work`, creates in `work` and `handoff` (which it cannot see)."""
    return accounts.create_agent("a1", claim_queues=["work"], create_queues=["work", "handoff"])[0]


def limited(agent: Agent, **limits: Any) -> Agent:
    Agent.objects.filter(pk=agent.pk).update(**limits)
    agent.refresh_from_db()
    return agent


# Held todos


def test_a_claim_takes_only_up_to_the_held_quota(agent: Agent, make_todo: MakeTodo) -> None:
    limited(agent, max_held=3)
    for _ in range(5):
        make_todo(queue="work")
    assert len(service.claim(agent, ttl=30, limit=2)) == 2
    assert len(service.claim(agent, ttl=30, limit=10)) == 1


def test_at_the_held_quota_a_claim_is_throttled_and_claims_nothing(
    agent: Agent, make_todo: MakeTodo, settings: Any
) -> None:
    settings.SWITCHBOARD_TODOS_AGENT_MAX_HELD = 2
    held = [
        make_todo(queue="work", state=State.CLAIMED, owner="a1", lease_expires_in=lease)
        for lease in (timedelta(seconds=7), timedelta(seconds=30))
    ]
    waiting = make_todo(queue="work")
    for arguments in (
        {},
        {"wait": 5},  # answered at once, not after the wait
        {"todo_id": waiting.id},
    ):
        with pytest.raises(Throttled, match="holds 2 todos") as refused:
            service.claim(agent, ttl=30, **arguments)
        assert refused.value.retry_after == 7  # until its earliest lease ends
        assert str(refused.value).endswith("Try again in 7 s.")  # for MCP and SQS, no header
    assert Todo.objects.get(pk=waiting.pk).state == State.PENDING
    Todo.objects.complete(held[1].id, "a1")
    assert [todo.id for todo in service.claim(agent, ttl=30)] == [waiting.id]


def test_an_empty_queue_below_the_quota_is_no_throttle(agent: Agent) -> None:
    assert service.claim(agent, ttl=30) == []


def test_the_held_quota_waits_at_most_a_minute(agent: Agent, make_todo: MakeTodo) -> None:
    limited(agent, max_held=1)
    make_todo(queue="work", state=State.CLAIMED, owner="a1", lease_expires_in=timedelta(hours=2))
    with pytest.raises(Throttled) as refused:
        service.claim(agent, ttl=30)
    assert refused.value.retry_after == service.HELD_RETRY_MAX


# Creations per minute


def test_creations_past_the_minute_quota_are_throttled_and_write_nothing(agent: Agent) -> None:
    """With a burst of the whole minute, its quota at once; the next fits once a creation's
    share of the minute (60/3 s) has passed by the database's clock."""
    limited(agent, max_creates_per_minute=3, burst_seconds=60)
    for number in range(3):
        service.create_for(agent, queue="work", kind="k", payload={"n": number})
    with pytest.raises(Throttled, match="no room for a todo now") as refused:
        service.create_for(agent, queue="work", kind="k", payload={"n": 3})
    assert refused.value.retry_after == 20
    assert Todo.objects.count() == 3
    Agent.objects.filter(pk=agent.pk).update(
        creates_paid_until=F("creates_paid_until") - timedelta(seconds=20)
    )
    assert service.create_for(agent, queue="work", kind="k")[1]  # a creation's share later


def test_a_refused_create_does_not_count(agent: Agent) -> None:
    limited(agent, max_creates_per_minute=1)
    with pytest.raises(InvalidTodo):
        service.create_for(agent, queue="work", kind="k", payload=[])  # type: ignore[arg-type]
    assert service.create_for(agent, queue="work", kind="k")[1]
    assert paid_ahead(agent) == pytest.approx(60, abs=1)  # one creation, a minute's share


def paid_ahead(agent: Agent) -> float:
    """Seconds the agent's creations are paid for ahead of the database's clock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM creates_paid_until - now())::float8 FROM todo_agents "
            "WHERE id = %s",
            [agent.pk],
        )
        return float(cursor.fetchone()[0])


# Attempts


def test_max_attempts_above_the_agents_limit_is_invalid(agent: Agent, settings: Any) -> None:
    settings.SWITCHBOARD_TODOS_AGENT_MAX_ATTEMPTS = 10
    with pytest.raises(InvalidTodo, match="max_attempts must be at most 10"):
        service.create_for(agent, queue="work", kind="k", max_attempts=11)
    assert not Todo.objects.exists()
    assert service.create_for(agent, queue="work", kind="k", max_attempts=10)[0].max_attempts == 10


def test_without_max_attempts_the_default_is_lowered_to_the_limit(agent: Agent) -> None:
    assert service.create_for(agent, queue="work", kind="k")[0].max_attempts == 5
    limited(agent, max_attempts_limit=3)
    assert service.create_for(agent, queue="work", kind="k")[0].max_attempts == 3


# Keys


def test_an_agent_cannot_squat_a_producers_idempotency_key(agent: Agent) -> None:
    squat, _ = service.create_for(agent, queue="work", kind="fake", idempotency_key="delivery-1")
    real, created = Todo.objects.create_todo(
        queue="work", kind="real", idempotency_key="delivery-1"
    )
    assert created and real.id != squat.id


def test_an_agent_never_receives_a_producers_todo_by_its_key(
    agent: Agent, make_todo: MakeTodo
) -> None:
    secret = make_todo(queue="handoff", idempotency_key="k", payload={"secret": 1})
    todo, created = service.create_for(agent, queue="handoff", kind="k", idempotency_key="k")
    assert created and todo.id != secret.id and todo.payload == {}


def test_a_key_held_by_a_todo_the_agent_cannot_see_is_a_conflict_naming_none(
    agent: Agent,
) -> None:
    """Its own earlier todo, in a queue it creates in but does not claim from."""
    first, _ = service.create_for(agent, queue="handoff", kind="k", idempotency_key="k")
    Todo.objects.claim_next("handoff", "someone-else", 60)
    with pytest.raises(TodoConflict) as conflict:
        service.create_for(agent, queue="handoff", kind="k", idempotency_key="k")
    assert "'k' is taken in queue 'handoff'" in str(conflict.value)
    assert first.id not in str(conflict.value) and "someone-else" not in str(conflict.value)
    assert Todo.objects.count() == 1


def test_two_agents_keys_are_their_own(agent: Agent) -> None:
    other = accounts.create_agent("a2", create_queues=["work"])[0]
    mine, _ = service.create_for(
        agent, queue="work", kind="k", idempotency_key="k", concurrency_key="c"
    )
    theirs, created = service.create_for(
        other, queue="work", kind="k", idempotency_key="k", concurrency_key="c"
    )
    assert created and theirs.id != mine.id
    shown = todo_json(theirs)
    assert (shown["idempotency_key"], shown["concurrency_key"]) == ("k", "c")
    assert theirs.concurrency_key == "agent:a2/c" != mine.concurrency_key


def test_an_agents_keys_are_at_most_128_characters(agent: Agent) -> None:
    with pytest.raises(InvalidTodo, match="idempotency_key is 129 characters long"):
        service.create_for(agent, queue="work", kind="k", idempotency_key="k" * 129)
    with pytest.raises(InvalidTodo, match="concurrency_key is 129 characters long"):
        service.create_for(agent, queue="work", kind="k", concurrency_key="k" * 129)
    longest_name = accounts.create_agent("n" * 100, create_queues=["work"])[0]
    todo, _ = service.create_for(longest_name, queue="work", kind="k", idempotency_key="k" * 128)
    assert todo_json(todo)["idempotency_key"] == "k" * 128


def test_an_agent_cannot_block_a_concurrency_key_of_a_queue_it_cannot_see(agent: Agent) -> None:
    """A pending todo it creates with a key and an assignee nobody serves, ahead of the
    producer's todo with the same key in another queue, leaves that todo claimable."""
    service.create_for(
        agent, queue="handoff", kind="k", concurrency_key="repo-1", assignee="nobody", priority=100
    )
    work, _ = Todo.objects.create_todo(queue="internal", kind="k", concurrency_key="repo-1")
    assert Todo.objects.claim_next("internal", "worker", 60) == work


def test_a_claim_by_id_conflict_does_not_name_a_todo_the_agent_cannot_see(
    agent: Agent, make_todo: MakeTodo
) -> None:
    holder = make_todo(queue="internal", state=State.CLAIMED, owner="w", concurrency_key="c")
    waiting = make_todo(queue="work", concurrency_key="c")
    with pytest.raises(TodoConflict) as conflict:
        service.claim(agent, todo_id=waiting.id, ttl=30)
    assert "waits for its concurrency key" in str(conflict.value)
    assert holder.id not in str(conflict.value)


def test_a_claim_by_id_conflict_names_a_holder_the_agent_may_see(
    agent: Agent, make_todo: MakeTodo
) -> None:
    holder = make_todo(queue="work", state=State.CLAIMED, owner="a2", concurrency_key="c")
    waiting = make_todo(queue="work", concurrency_key="c")
    with pytest.raises(TodoConflict, match=holder.id):
        service.claim(agent, todo_id=waiting.id, ttl=30)


def test_what_the_quotas_cost(
    agent: Agent, make_todo: MakeTodo, django_assert_num_queries: Any
) -> None:
    """A claim that takes work is still one statement (the claim counts what the agent holds,
    and checks its credential); an empty one adds the check of its credential and the count of
    what it holds; a create adds the count of its minute."""
    make_todo(queue="work")
    with django_assert_num_queries(1):
        assert service.claim(agent, ttl=30)
    with django_assert_num_queries(3):
        assert service.claim(agent, ttl=30) == []
    with CaptureQueriesContext(connection) as create:
        service.create_for(agent, queue="work", kind="k")
    savepoint, counted, created, released = (query["sql"] for query in create.captured_queries)
    assert savepoint.startswith("SAVEPOINT") and released.startswith("RELEASE")
    assert "UPDATE todo_agents" in counted and "INSERT INTO todos" in created


@pytest.mark.django_db(transaction=True)
def test_concurrent_creations_never_pass_the_quota() -> None:
    """Eight connections creating at once for one agent whose burst is its whole minute:
    exactly its quota is created."""
    agent = accounts.create_agent("racer", create_queues=["race"])[0]
    limited(agent, max_creates_per_minute=10, burst_seconds=60)

    def create(number: int) -> int:
        throttled = 0
        for n in range(5):
            try:
                service.create_for(agent, queue="race", kind="k", payload={"n": number * 5 + n})
            except Throttled:
                throttled += 1
        return throttled

    assert sum(run_in_threads(8, create)) == 30
    assert Todo.objects.filter(queue="race").count() == 10
