"""The agents' HTTP API served by a real ASGI server (uvicorn, in a subprocess) to real clients."""

from __future__ import annotations

import base64
import collections
import json
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from django.db import connections

from switchboard_todos.agents import accounts
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


#: A body under DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB) that costs JSON parsing the most: about
#: 800,000 empty arrays, each a Python object to make and walk.
HEAVY_BODY = b'{"ttl": 30, "x": [' + b",".join([b"[]"] * 800_000) + b"]}"


def test_anonymous_large_bodies_do_not_hold_up_a_long_poll(server: str) -> None:
    """Bodies sent with a token nobody holds, or none, are not parsed: the event loop that
    wakes the long polls stays free. Before, each was parsed on the loop before the token was
    looked up, and a waiting claim answered seconds late."""
    token = accounts.create_agent("poller", claim_queues=["poll"])[1]
    connections.close_all()
    assert len(HEAVY_BODY) < 2_621_440
    answered: list[tuple[httpx.Response, float]] = []
    flooding = threading.Event()

    def poll() -> None:
        with agent_client(server, token) as client:
            response = client.post("/claim/", json={"ttl": 30, "wait": 20})
            answered.append((response, time.monotonic()))

    def flood(number: int) -> list[int]:
        statuses = []
        authorization = "Bearer sbt_" + f"{number:043d}" if number % 2 else "Bearer nope"
        with httpx.Client(base_url=server, timeout=60) as client:
            while not answered:
                flooding.set()
                sent = client.post(
                    "/claim/", content=HEAVY_BODY, headers={"Authorization": authorization}
                )
                statuses.append(sent.status_code)
        return statuses

    poller = threading.Thread(target=poll)
    poller.start()
    flooders = threading.Thread(target=lambda: statuses.extend(run_in_threads(8, flood)))
    statuses: list[list[int]] = []
    flooders.start()
    flooding.wait(10)
    time.sleep(1)  # the flood is on; the poll waits
    todo, _ = Todo.objects.create_todo(queue="poll", kind="k")
    enqueued = time.monotonic()
    connections.close_all()
    poller.join(30)
    flooders.join(60)
    [(response, at)] = answered
    assert [claimed["id"] for claimed in response.json()["todos"]] == [todo.id]
    assert at - enqueued < 1.5, at - enqueued
    assert {status for each in statuses for status in each} == {401}


def test_a_cursor_that_names_no_todo_id_is_refused(server: str) -> None:
    """The cursor's id goes into a query: a NUL in it was a 500."""
    token = accounts.create_agent("lister", claim_queues=["work"])[1]
    position = json.dumps(["2030-01-01T00:00:00+00:00", "td_\u0000"]).encode()
    cursor = base64.urlsafe_b64encode(position).decode().rstrip("=")
    with agent_client(server, token) as client:
        refused = client.get("/todos/", params={"cursor": cursor})
    assert refused.status_code == 422, refused.text
    assert refused.headers["content-type"] == "application/problem+json"


def test_a_plain_http_claim_gets_djangos_redirect_to_https(
    subprocess_env: dict[str, str], make_todo: Callable[..., Todo]
) -> None:
    """With SECURE_SSL_REDIRECT, the verbs answered in front of Django honour the HTTPS
    settings as Django's SecurityMiddleware does: the redirect, and nothing claimed; behind a
    proxy that says the request was HTTPS (SECURE_PROXY_SSL_HEADER), the claim and HSTS."""
    token = accounts.create_agent("secure", claim_queues=["work"])[1]
    todo = make_todo(queue="work")
    https = {
        "SECURE_SSL_REDIRECT": "on",
        "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
        "SECURE_HSTS_SECONDS": "3600",
    }
    with serve({**subprocess_env, **https}) as (base, process):
        with agent_client(base, token) as client:
            plain = client.post("/claim/", json={"ttl": 30})
            assert Todo.objects.get(pk=todo.pk).state == State.PENDING
            proxied = client.post(
                "/claim/", json={"ttl": 30}, headers={"X-Forwarded-Proto": "https"}
            )
        process.terminate()
        assert "Traceback" not in process.communicate(timeout=30)[0]
    assert plain.status_code == 301
    assert plain.headers["location"] == base.replace("http://", "https://") + "/claim/"
    assert proxied.status_code == 200
    assert [claimed["id"] for claimed in proxied.json()["todos"]] == [todo.id]
    assert proxied.headers["strict-transport-security"] == "max-age=3600"
