"""Paced quotas (issue 35: a minute's quota must not be spendable in one burst): an agent writes at
most SWITCHBOARD_TODOS_AGENT_BURST_SECONDS' worth of a minute's creations or bytes at once, and
the quotas refill continuously at their rate by the database's clock (count_writes,
sql/agents.sql). Time passes by moving the agent's debt back in its row, never by sleeping;
the database's clock stands still in a test's transaction, so the figures are exact."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
from django.db import connection

from switchboard_todos.agents import accounts, service
from switchboard_todos.agents.service import quotas
from switchboard_todos.exceptions import Throttled
from switchboard_todos.models import Agent, Todo
from tests.conftest import database_url, run_in_threads
from tests.helpers import db_now
from tests.test_agent_bytes import of

pytestmark = pytest.mark.django_db

#: The test agent's quota of creations a minute: one each 2 s, 3 in the default burst of 6 s.
QUOTA = 30


@pytest.fixture
def agent() -> Agent:
    agent = accounts.create_agent("pacer", create_queues=["work"])[0]
    return limited(agent, max_creates_per_minute=QUOTA)


def limited(agent: Agent, **limits: Any) -> Agent:
    Agent.objects.filter(pk=agent.pk).update(**limits)
    agent.refresh_from_db()
    return agent


def create(agent: Agent, count: int = 1) -> None:
    if count == 1:
        service.create_for(agent, queue="work", kind="k")
    else:
        service.create_many_for(agent, todos=[{"queue": "work", "kind": "k"}] * count)


def owed(agent: Agent, column: str = "creates_paid_until") -> float:
    """Seconds of the quota the agent owes: paid for ahead of the database's clock."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT coalesce(greatest(extract(epoch FROM {column} - now()), 0), 0)::float8 "
            "FROM todo_agents WHERE id = %s",
            [agent.pk],
        )
        return float(cursor.fetchone()[0])


def later(agent: Agent, seconds: float) -> None:
    """`seconds` pass for the agent's quotas: its debts move back by as much."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todo_agents SET creates_paid_until = creates_paid_until - %s * interval '1 s', "
            "bytes_paid_until = bytes_paid_until - %s * interval '1 s' WHERE id = %s",
            [seconds, seconds, agent.pk],
        )


def test_a_burst_past_the_allowance_is_throttled_until_a_creation_refills(agent: Agent) -> None:
    for _ in range(3):
        create(agent)
    assert owed(agent) == 6.0
    with pytest.raises(Throttled, match="at most 6 seconds' worth at once") as refused:
        create(agent)
    assert refused.value.retry_after == 2  # a creation's share of the minute
    assert str(refused.value).endswith("Try again in 2 s.")
    assert Todo.objects.count() == 3 and owed(agent) == 6.0  # nothing counted


def test_refused_writes_are_told_one_turn_each(agent: Agent) -> None:
    """Ten requests refused at once are told to come back one creation's share of the minute
    apart (2 s here), not all at the same moment, to be refused again together."""
    for _ in range(3):
        create(agent)
    began = time.monotonic()
    told = []
    for _ in range(10):
        with pytest.raises(Throttled) as refused:
            create(agent)
        told.append(refused.value.retry_after)
    elapsed = time.monotonic() - began
    assert told == sorted(told)
    assert told[-1] - told[0] >= 9 * 2 - elapsed - 1  # whole seconds: one of rounding
    assert Todo.objects.count() == 3


def test_the_quota_refills_by_the_database_clock_up_to_the_burst(agent: Agent) -> None:
    for _ in range(3):
        create(agent)
    later(agent, 1.9)
    with pytest.raises(Throttled) as refused:
        create(agent)
    assert refused.value.retry_after == 1  # 0.1 s more, in whole seconds
    later(agent, 0.1)
    create(agent)
    with pytest.raises(Throttled):
        create(agent)
    later(agent, 600)  # ten quiet minutes refill the burst, no more
    for _ in range(3):
        create(agent)
    with pytest.raises(Throttled):
        create(agent)
    assert Todo.objects.count() == 7


def test_one_write_larger_than_the_burst_goes_through_when_nothing_is_owed(agent: Agent) -> None:
    """10 creations are 20 s of the quota, more than its 6 s burst but within its minute."""
    create(agent)
    with pytest.raises(Throttled) as refused:
        create(agent, 10)
    assert refused.value.retry_after == 2  # until nothing is owed
    later(agent, 2)
    create(agent, 10)
    assert owed(agent) == 20.0
    with pytest.raises(Throttled) as refused:
        create(agent)
    assert refused.value.retry_after == 16  # 20 + 2 - 6 s
    assert Todo.objects.count() == 11


def test_the_bytes_are_paced_alike(agent: Agent) -> None:
    """60,000 bytes a minute: 1,000 a second, 6,000 at once."""
    limited(agent, max_bytes_per_minute=60_000)
    for _ in range(2):
        service.create_for(agent, queue="work", kind="k", payload=of(2500))
    assert owed(agent, "bytes_paid_until") == 5.0
    with pytest.raises(Throttled, match="no room for 2500 more bytes now") as refused:
        service.create_for(agent, queue="work", kind="k", payload=of(2500))
    assert refused.value.retry_after == 2  # 1.5 s until 2,500 bytes fit
    assert owed(agent) == 4.0  # the refused create counted no creation either
    later(agent, 1.5)
    service.create_for(agent, queue="work", kind="k", payload=of(2500))


def test_sixty_seconds_give_a_minute_at_once(agent: Agent, settings: Any) -> None:
    settings.SWITCHBOARD_TODOS_AGENT_BURST_SECONDS = 60
    for _ in range(QUOTA):
        create(agent)
    with pytest.raises(Throttled, match="at most 60 seconds' worth") as refused:
        create(agent)
    assert refused.value.retry_after == 2


def test_the_agents_own_burst_wins_over_the_setting(agent: Agent, settings: Any) -> None:
    settings.SWITCHBOARD_TODOS_AGENT_BURST_SECONDS = 60
    limited(agent, burst_seconds=4)
    for _ in range(2):
        create(agent)
    with pytest.raises(Throttled, match="at most 4 seconds' worth"):
        create(agent)


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_never_pass_the_burst_and_the_rate() -> None:
    """Eight connections creating as fast as they can for one agent of 60 creations a minute (6
    at once): what went through is at most the burst and a creation for each second the
    database's clock moved meanwhile."""
    agent = accounts.create_agent("racer", create_queues=["race"])[0]
    limited(agent, max_creates_per_minute=60)
    started = db_now()

    def race(_index: int) -> int:
        throttled = 0
        for _ in range(30):
            try:
                service.create_for(agent, queue="race", kind="k")
            except Throttled:
                throttled += 1
        return throttled

    throttled = sum(run_in_threads(8, race))
    elapsed = (db_now() - started).total_seconds()
    created = Todo.objects.filter(queue="race").count()
    assert created + throttled == 240
    assert 6 <= created <= 6 + elapsed, (created, elapsed)


@pytest.mark.django_db(transaction=True)
def test_a_write_past_the_quota_is_refused_without_waiting_for_the_agents_row() -> None:
    """Another session holds the agent's row (as its next admitted create would): a create its
    quota refuses is refused at once, while that lock is still held, rather than queueing on
    the row with a connection. The test's connection gives up on any lock wait after 5 s (a
    failure, not a pause)."""
    agent = accounts.create_agent("queuer", create_queues=["work"])[0]
    limited(agent, max_creates_per_minute=QUOTA)
    for _ in range(3):
        create(agent)
    with psycopg.connect(database_url(), autocommit=True) as other, other.transaction():
        other.execute("SELECT 1 FROM todo_agents WHERE id = %s FOR NO KEY UPDATE", [agent.pk])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '5s'")
        try:
            with pytest.raises(Throttled) as refused:
                create(agent)
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
    assert 1 <= refused.value.retry_after <= 2  # the database's clock moves here
    assert Todo.objects.filter(queue="work").count() == 3


def test_turns_already_past_are_forgotten(agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    """The turns a process remembers stay bounded: those past are dropped once there are
    TURNS_KEPT of them (a rotated token's, a deleted agent's), those to come are kept."""
    monkeypatch.setattr(quotas, "TURNS_KEPT", 4)
    monkeypatch.setattr(quotas, "_turns", {})
    quotas._turns.update({(f"gone-{n}", "creations"): 0.0 for n in range(3)})
    quotas._turns[("waiting", "creations")] = time.monotonic() + 3600
    for _ in range(3):
        create(agent)
    with pytest.raises(Throttled):
        create(agent)
    assert set(quotas._turns) == {("waiting", "creations"), (agent.token_hash, "creations")}
