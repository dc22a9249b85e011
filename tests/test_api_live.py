"""The agents' HTTP API served by a real ASGI server (uvicorn, in a subprocess) to real clients."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from django.db import connections

from switchboard_todos.agents import accounts, errors
from switchboard_todos.models import State, Todo
from tests.asgi import serve
from tests.conftest import run_in_threads

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server(subprocess_env: dict[str, str]) -> Iterator[str]:
    """The test settings' ASGI application under uvicorn; its base URL once it answers.

    Its pool of 4 connections is smaller than the agents' numbers below: requests share them.
    """
    with serve({**subprocess_env, "DATABASE_POOL_SIZE": "4"}) as (base, process):
        yield base
        process.terminate()
        output = process.communicate(timeout=30)[0]
    assert "Traceback" not in output, output


def agent_client(base: str, token: str) -> httpx.Client:
    """One agent's keep-alive connection."""
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def test_eight_agents_drain_a_thousand_todos_each_exactly_once(server: str) -> None:
    tokens = [accounts.create_agent(f"agent-{n}", claim_queues=["drain"])[1] for n in range(8)]
    Todo.objects.enqueue_many(
        {"queue": "drain", "kind": "job", "payload": {"n": n}} for n in range(1000)
    )
    connections.close_all()

    def drain(number: int) -> list[str]:
        completed: list[str] = []
        with agent_client(server, tokens[number]) as client:
            while True:
                claimed = client.post("/claim/", json={"ttl": 60, "limit": 5})
                assert claimed.status_code == 200, claimed.text
                todos = claimed.json()["todos"]
                if not todos:
                    return completed
                for todo in todos:
                    done = client.post(f"/todos/{todo['id']}/complete/", json={"result": number})
                    assert done.status_code == 200, done.text
                    completed.append(todo["id"])

    completed = run_in_threads(8, drain)
    everything = [todo_id for ids in completed for todo_id in ids]
    assert len(everything) == len(set(everything)) == 1000
    assert sum(1 for ids in completed if ids) > 1  # really concurrent
    rows = Todo.objects.values_list("state", "attempt", "owner", "result")
    assert collections.Counter((state, attempt) for state, attempt, _, _ in rows) == {
        (State.DONE, 1): 1000
    }
    assert all(owner == f"agent-{result}" for _, _, owner, result in rows)


def test_long_poll_returns_promptly_when_a_todo_is_enqueued(server: str) -> None:
    token = accounts.create_agent("poller", claim_queues=["poll"])[1]
    connections.close_all()
    responses: list[httpx.Response] = []
    answered: list[float] = []

    def poll() -> None:
        with agent_client(server, token) as client:
            responses.append(client.post("/claim/", json={"ttl": 30, "wait": 20}))
            answered.append(time.monotonic())

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(1)  # let the poll start waiting; the bound below holds either way
    todo, _ = Todo.objects.create_todo(queue="poll", kind="k")
    enqueued = time.monotonic()
    poller.join(30)
    [response] = responses
    assert response.status_code == 200
    assert [claimed["id"] for claimed in response.json()["todos"]] == [todo.id]
    assert answered[0] - enqueued < 5  # far below the 20 s wait


def test_waiting_polls_do_not_hold_up_other_agents(
    server: str, make_todo: Callable[..., Todo]
) -> None:
    """Twenty agents long-polling an empty queue; another agent's claim still answers at once.

    The waits hold neither a thread nor one of the server's 4 pooled connections.
    """
    waiting = [accounts.create_agent(f"w{n}", claim_queues=["empty"])[1] for n in range(20)]
    busy = accounts.create_agent("busy", claim_queues=["ready"])[1]
    todo = make_todo(queue="ready")
    connections.close_all()

    def wait_for_nothing(number: int) -> int:
        with agent_client(server, waiting[number]) as client:
            response = client.post("/claim/", json={"ttl": 30, "wait": 4})
            return len(response.json()["todos"])

    pollers = threading.Thread(target=lambda: results.extend(run_in_threads(20, wait_for_nothing)))
    results: list[int] = []
    pollers.start()
    time.sleep(1)
    with agent_client(server, busy) as client:
        started = time.monotonic()
        claimed = client.post("/claim/", json={"ttl": 30})
        elapsed = time.monotonic() - started
    pollers.join(30)
    assert claimed.json()["todos"][0]["id"] == todo.id
    assert elapsed < 2  # not queued behind the twenty waits of 4 s
    assert results == [0] * 20


def test_progress_notes_and_a_cancel_reach_the_agent(server: str) -> None:
    """An agent's heartbeat stores its progress note (shown on the todo and in its list; one
    too large is refused); once an operator cancels the todo, the agent's heartbeat, complete
    and fail answer 409 with the problem type todo-cancelled, and change nothing."""
    token = accounts.create_agent("cancelled-agent", claim_queues=["jobs"])[1]
    todo, _ = Todo.objects.create_todo(queue="jobs", kind="k")
    connections.close_all()
    beat_url = f"/todos/{todo.id}/heartbeat/"
    with agent_client(server, token) as client:
        assert client.post("/claim/", json={"ttl": 30}).status_code == 200
        beat = client.post(beat_url, json={"ttl": 30, "progress": {"pages": 2}})
        assert (beat.status_code, beat.json()["progress"]) == (200, {"pages": 2})
        [listed] = client.get("/todos/", params={"state": "claimed"}).json()["todos"]
        assert listed["progress"] == {"pages": 2}
        too_large = client.post(beat_url, json={"ttl": 30, "progress": "x" * 20_000})
        assert too_large.status_code == 422 and "limit is 16384" in too_large.json()["detail"]
        Todo.objects.cancel(todo.id, "wrong customer")
        connections.close_all()
        answers = [
            client.post(f"/todos/{todo.id}/{verb}/", json=body)
            for verb, body in (
                ("heartbeat", {"ttl": 30, "progress": {"pages": 3}}),
                ("complete", {"result": "late"}),
                ("fail", {"error": "late"}),
            )
        ]
    for answer in answers:
        assert answer.status_code == 409, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
        problem = answer.json()
        assert problem["type"] == errors.TODO_CANCELLED.type
        assert "cancelled by an operator while 'cancelled-agent' held it" in problem["detail"]
    row = Todo.objects.get(pk=todo.pk)
    assert (row.state, row.progress) == (State.FAILED, {"pages": 2})
    assert row.result == {"type": "Cancelled", "message": "wrong customer"}
