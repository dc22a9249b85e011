"""The cap on an agent's requests in flight (SWITCHBOARD_TODOS_AGENT_MAX_CONCURRENT), in process:
each surface counts a request once its agent is known, and past the cap answers in its own
words, having run no statement but the credential's lookup and taken no connection for the
verb. Against a live server, as a hostile agent floods it: tests/test_request_cap_live.py."""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack
from typing import Any

import httpx
import pytest
from django.db.backends.signals import connection_created
from django.test import Client, override_settings

from switchboard_todos.agents import accounts, errors, request_cap, tokens
from switchboard_todos.api.asgi import AgentsAPIFirst
from switchboard_todos.claims import long_polls
from switchboard_todos.exceptions import Throttled
from switchboard_todos.mcp.server import PROBLEM_META, Tools
from switchboard_todos.models import Agent, State, Todo
from switchboard_todos.sqs.views import CONTENT_TYPE
from tests.asgi import django_application
from tests.helpers import MakeTodo, sqs_headers

pytestmark = pytest.mark.django_db

#: The cap of these tests.
CAP = 2
REFUSAL = f"Agent 'a1' already has {CAP} requests in flight on this server"


@pytest.fixture(autouse=True)
def _stop_long_polls() -> Iterator[None]:
    yield
    long_polls.stop()


@pytest.fixture
def agent_and_token() -> tuple[Agent, str]:
    """Agent a1, which claims from and creates in `work`, and its token."""
    return accounts.create_agent("a1", claim_queues=["work"], create_queues=["work"])


def held_to_the_cap(agent: Agent) -> ExitStack:
    """CAP requests of `agent` in flight, until the stack is closed."""
    held = ExitStack()
    held.enter_context(override_settings(SWITCHBOARD_TODOS_AGENT_MAX_CONCURRENT=CAP))
    for _ in range(CAP):
        held.enter_context(request_cap.admitted(agent))
    return held


@pytest.fixture
def at_its_cap(agent_and_token: tuple[Agent, str]) -> Iterator[Agent]:
    """Agent a1 with CAP requests in flight, held by the test."""
    with held_to_the_cap(agent_and_token[0]):
        yield agent_and_token[0]


def test_past_the_cap_a_request_is_throttled() -> None:
    agent = Agent(name="a1")
    with held_to_the_cap(agent) as held:
        with pytest.raises(Throttled, match=REFUSAL) as refused:
            held.enter_context(request_cap.admitted(agent))
        assert refused.value.retry_after == 1
        held.enter_context(request_cap.admitted(Agent(name="a2")))  # another agent: its own cap
    with held_to_the_cap(agent):  # the ended ones count no more
        pass


def test_an_agents_token_is_known_while_it_has_requests_in_flight(
    agent_and_token: tuple[Agent, str],
) -> None:
    """At its cap, its token is refused before the lookup, and any other is not; once it has
    nothing in flight, the token is forgotten (here: the agent at its cap again, under a token
    rotated since, does not make the old one refused before its lookup)."""
    agent, token = agent_and_token
    with held_to_the_cap(agent):
        with pytest.raises(Throttled, match=REFUSAL):
            request_cap.refuse_known(token)
        request_cap.refuse_known(tokens.issue_token().token)
    rotated = Agent(pk=agent.pk, name=agent.name, token_hash="rotated")
    with held_to_the_cap(rotated):
        request_cap.refuse_known(token)


def in_another_request(held: ExitStack, *counts: AbstractContextManager[None]) -> None:
    """Enter `counts` in turn as a request of its own would (in a context of its own), until
    `held` closes."""
    context = contextvars.Context()
    for counted in counts:
        context.run(counted.__enter__)
        held.callback(context.run, counted.__exit__, None, None, None)


def test_a_request_counted_before_its_lookup_is_counted_once(
    agent_and_token: tuple[Agent, str],
) -> None:
    """Counted in front of Django's handler before its token is looked up, then by its agent
    once looked up, and on another surface meanwhile: two requests, two counts."""
    agent, token = agent_and_token
    with override_settings(SWITCHBOARD_TODOS_AGENT_MAX_CONCURRENT=CAP), ExitStack() as held:
        held.enter_context(request_cap.admitted_early(token))
        held.enter_context(request_cap.admitted(agent))
        request_cap.refuse_known(token)  # itself is not what takes the agent to its cap
        in_another_request(held, request_cap.admitted(agent))  # its SQS request, say
        with pytest.raises(Throttled, match=REFUSAL):
            in_another_request(held, request_cap.admitted_early(token))
    with held_to_the_cap(agent):  # all ended: none counts any more
        pass


def test_requests_counted_before_their_token_was_known_count_against_its_agent(
    agent_and_token: tuple[Agent, str],
) -> None:
    """The first requests of a token not known here are counted under the token, CAP at most;
    once one of them is looked up, all of them are its agent's, and its other surfaces find
    the agent at its cap."""
    agent, token = agent_and_token
    with override_settings(SWITCHBOARD_TODOS_AGENT_MAX_CONCURRENT=CAP), ExitStack() as held:
        in_another_request(held, request_cap.admitted_early(token))
        in_another_request(held, request_cap.admitted_early(token))
        with pytest.raises(Throttled, match="This token's agent already has 2 requests"):
            in_another_request(held, request_cap.admitted_early(token))
        with pytest.raises(Throttled, match=REFUSAL):  # its SQS request, say
            in_another_request(held, request_cap.admitted(agent))
    with override_settings(SWITCHBOARD_TODOS_AGENT_MAX_CONCURRENT=CAP), ExitStack() as held:
        in_another_request(held, request_cap.admitted_early(token))
        in_another_request(held, request_cap.admitted_early(token), request_cap.admitted(agent))
        for refused in (request_cap.admitted(agent), request_cap.admitted_early(token)):
            with pytest.raises(Throttled, match=REFUSAL):  # the agent's, both
                in_another_request(held, refused)
    with held_to_the_cap(agent):
        pass


def assert_throttled_problem(response: Any) -> None:
    """The API's 429: a problem of type throttled, with Retry-After."""
    assert response.status_code == 429, response.content
    assert response.headers["Content-Type"] == "application/problem+json"
    assert response.headers["Retry-After"] == "1"
    problem = json.loads(response.content)
    assert problem["type"] == errors.THROTTLED.type and REFUSAL in problem["detail"]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/api/todos/", {"queue": "work", "kind": "k"}),
        ("get", "/api/todos/", None),
        ("post", "/api/claim/", {"ttl": 30, "wait": 5}),  # a long poll is a request in flight
    ],
)
@pytest.mark.parametrize("known", [True, False], ids=["token-known", "token-rotated"])
def test_past_the_cap_the_api_answers_429_before_any_statement_of_the_verb(
    client: Client,
    agent_and_token: tuple[Agent, str],
    make_todo: MakeTodo,
    django_assert_num_queries: Any,
    method: str,
    path: str,
    body: Any,
    known: bool,
) -> None:
    """The token of an agent at its cap is refused before its lookup; a token the agent's
    requests in flight were not admitted with (it was rotated since) after it."""
    agent, token = agent_and_token
    todo = make_todo(queue="work")
    holder = agent if known else Agent(pk=agent.pk, name=agent.name, token_hash="before")
    headers = {"Authorization": f"Bearer {token}"}
    with held_to_the_cap(holder), django_assert_num_queries(0 if known else 1):
        if method == "get":
            response = client.get(path, headers=headers)
        else:
            data = json.dumps(body)
            response = client.post(path, data, content_type="application/json", headers=headers)
    assert_throttled_problem(response)
    assert list(Todo.objects.values_list("pk", "state")) == [(todo.pk, State.PENDING)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/claim/", {"ttl": 30}),
        ("/api/claim/", {"ttl": 30, "wait": 5}),
        ("/api/todos/{id}/complete/", {}),
    ],
)
@pytest.mark.parametrize("known", [True, False], ids=["token-known", "token-rotated"])
def test_past_the_cap_the_agent_loop_in_front_answers_429(
    agent_and_token: tuple[Agent, str], make_todo: MakeTodo, path: str, body: Any, known: bool
) -> None:
    """AgentsAPIFirst's verbs, a long poll's wait included: refused on the event loop when the
    token is known, on its thread once looked up when it is not."""
    agent, token = agent_and_token
    todo = make_todo(queue="work", state=State.CLAIMED, owner="a1")
    holder = agent if known else Agent(pk=agent.pk, name=agent.name, token_hash="before")
    fast = AgentsAPIFirst(django_application, threads=1)
    headers = {"Authorization": f"Bearer {token}"}

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=fast)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            return await http.post(path.format(id=todo.id), json=body, headers=headers)

    try:
        with held_to_the_cap(holder):
            response = asyncio.run(send())
    finally:
        fast.close()
    assert_throttled_problem(response)
    assert Todo.objects.get(pk=todo.pk).state == State.CLAIMED


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/api/todos/", {"queue": "work", "kind": "k"}),
        ("POST", "/api/todos/batch/", {"todos": [{"queue": "work", "kind": "k"}]}),
        ("GET", "/api/todos/", None),
        ("POST", "/api/claim/", {"ttl": 30}),
    ],
)
def test_in_front_a_token_past_the_cap_is_refused_before_it_is_known(
    agent_and_token: tuple[Agent, str], method: str, path: str, body: Any
) -> None:
    """CAP requests of a token not yet looked up, counted in front of Django's handler: the
    next one, whether AgentsAPIFirst answers it or passes it on, is refused on the event loop,
    before Django's handler, a thread or a statement."""
    _, token = agent_and_token
    fast = AgentsAPIFirst(django_application, threads=1)
    headers = {"Authorization": f"Bearer {token}"}

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=fast)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            return await http.request(method, path, json=body, headers=headers)

    try:
        with override_settings(SWITCHBOARD_TODOS_AGENT_MAX_CONCURRENT=CAP), ExitStack() as held:
            for _ in range(CAP):
                in_another_request(held, request_cap.admitted_early(token))
            response = asyncio.run(send())
    finally:
        fast.close()
    assert response.status_code == 429, response.content
    assert response.headers["Retry-After"] == "1"
    assert "This token's agent already has 2 requests in flight" in response.json()["detail"]
    assert not Todo.objects.exists()


def test_past_the_cap_an_mcp_tool_call_is_a_tool_error_without_a_connection(
    at_its_cap: Agent,
) -> None:
    opened: list[object] = []
    ran: list[Agent] = []

    async def agent() -> Agent:
        return at_its_cap

    async def list_todos(agent: Agent) -> dict[str, Any]:
        ran.append(agent)
        return {}

    def note(**kwargs: Any) -> None:
        opened.append(kwargs["connection"])

    connection_created.connect(note)
    try:
        result = asyncio.run(Tools(agent)._run(list_todos))
    finally:
        connection_created.disconnect(note)
    assert (ran, opened) == ([], [])
    [text] = [block.text for block in result.content if block.type == "text"]
    assert result.is_error and text.startswith("Too many requests (429): " + REFUSAL)
    assert "Retry-After: 1 s." in text
    assert result.meta is not None and result.meta[PROBLEM_META]["retry_after"] == 1


def test_past_the_cap_sqs_answers_request_throttled_after_the_signatures_lookup_only(
    client: Client, at_its_cap: Agent, make_todo: MakeTodo, django_assert_num_queries: Any
) -> None:
    todo = make_todo(queue="work")
    params = {"QueueUrl": "http://testserver/sqs/work", "MaxNumberOfMessages": 1}
    headers = sqs_headers(at_its_cap, "http://testserver/sqs/", "ReceiveMessage", params)
    del headers["Content-Type"]  # the test client's content_type sends it
    with django_assert_num_queries(1):  # the agent whose secret signed it
        response = client.post(
            "/sqs/", json.dumps(params), content_type=CONTENT_TYPE, headers=headers
        )
    answer = json.loads(response.content)
    assert answer["__type"] == "com.amazonaws.sqs#RequestThrottled", answer
    assert REFUSAL in answer["message"]
    assert response.status_code == 403  # as SQS, so that botocore retries it
    assert Todo.objects.get(pk=todo.pk).state == State.PENDING
