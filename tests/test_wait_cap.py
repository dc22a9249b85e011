"""The cap on an agent's long polls waiting at once (SWITCHBOARD_TODOS_AGENT_MAX_WAITS)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest
from asgiref.sync import async_to_sync
from django.test import override_settings

from switchboard_todos.agents import accounts, service
from switchboard_todos.agents import long_poll_cap as cap
from switchboard_todos.claims import long_polls
from switchboard_todos.exceptions import Throttled
from switchboard_todos.models import Agent, State, Todo

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _stop_waiting() -> Iterator[None]:
    yield
    long_polls.stop()


@pytest.fixture
def agent() -> Agent:
    return accounts.create_agent("a1", claim_queues=["work"])[0]


def test_past_the_cap_a_wait_is_throttled() -> None:
    agent = Agent(name="a1")
    with override_settings(SWITCHBOARD_TODOS_AGENT_MAX_WAITS=2), ExitStack() as held:
        held.enter_context(cap.admitted(agent, 5))
        held.enter_context(cap.admitted(agent, 5))
        with pytest.raises(Throttled, match=r"'a1' already has 2 long polls waiting") as refused:
            held.enter_context(cap.admitted(agent, 5))
        assert refused.value.retry_after == 1
        held.enter_context(cap.admitted(agent, 0))  # a claim without a wait is not a long poll
        held.enter_context(cap.admitted(Agent(name="a2"), 5))  # another agent: its own cap
    with cap.admitted(agent, 5), cap.admitted(agent, 5):  # ended waits count no more
        pass


@pytest.mark.parametrize(
    "claim", [service.claim, async_to_sync(service.aclaim)], ids=["sync", "async"]
)
def test_a_throttled_long_poll_claims_nothing(
    agent: Agent, make_todo: Callable[..., Todo], claim: Callable[..., list[Todo]]
) -> None:
    """The cap is checked before anything is claimed; claims without a wait go on."""
    todo = make_todo(queue="work")
    with override_settings(SWITCHBOARD_TODOS_AGENT_MAX_WAITS=1), cap.admitted(agent, 20):
        with pytest.raises(Throttled):
            claim(agent, ttl=30, wait=1)
        assert Todo.objects.get(pk=todo.pk).state == State.PENDING
        assert [claimed.pk for claimed in claim(agent, ttl=30)] == [todo.pk]


@pytest.mark.parametrize(
    "get", [service.get_todo, async_to_sync(service.aget_todo)], ids=["sync", "async"]
)
def test_a_read_with_a_wait_is_a_long_poll(
    agent: Agent, make_todo: Callable[..., Todo], get: Callable[..., Todo]
) -> None:
    """A read waiting for its todo to end counts against the cap; one without a wait, or of a
    todo already ended, is answered at once."""
    todo = make_todo(queue="work")
    with override_settings(SWITCHBOARD_TODOS_AGENT_MAX_WAITS=1), cap.admitted(agent, 20):
        with pytest.raises(Throttled):
            get(agent, todo.id, wait=1)
        assert get(agent, todo.id).pk == todo.pk
        Todo.objects.filter(pk=todo.pk).update(state=State.DONE)
        assert get(agent, todo.id, wait=1).state == State.DONE
