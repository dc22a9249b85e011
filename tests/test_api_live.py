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

from switchboard_todos.agents import accounts, errors
from switchboard_todos.models import Agent, State, Todo
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


def test_a_read_with_a_wait_answers_when_the_todo_ends(server: str) -> None:
    """GET todos/<id>/?wait= long-polls the todo: answered with its result once its holder
    completes it, well before the wait is over; a wait past 20 s is refused."""
    token = accounts.create_agent("producer", claim_queues=["results"])[1]
    todo, _ = Todo.objects.create_todo(queue="results", kind="k")
    connections.close_all()
    answers: list[httpx.Response] = []
    answered: list[float] = []

    def read() -> None:
        with agent_client(server, token) as client:
            answers.append(client.get(f"/todos/{todo.id}/", params={"wait": 20}))
            answered.append(time.monotonic())

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(1)  # let the read start waiting; the bound below holds either way
    Todo.objects.claim(todo.id, "w", ttl=30)
    Todo.objects.complete(todo.id, "w", result={"answer": 42})
    completed = time.monotonic()
    reader.join(30)
    [answer] = answers
    assert answer.status_code == 200, answer.text
    assert (answer.json()["state"], answer.json()["result"]) == ("done", {"answer": 42})
    assert answered[0] - completed < 5  # far below the 20 s wait
    with agent_client(server, token) as client:
        too_long = client.get(f"/todos/{todo.id}/", params={"wait": 21})
    assert too_long.status_code == 422, too_long.text


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


# What one agent may take, and what it may see (issue 24 §2, §3): tried as a hostile agent would


def test_a_hundred_failures_of_a_mebibyte_keep_a_bounded_history(server: str) -> None:
    """Each fail sends 1 MiB of error; the todo keeps the entries of at most 64 KiB that fit in
    256 KiB (MAX_ERROR_HISTORY_BYTES), three, and counts the 97 it dropped. Before, its history
    grew by the whole error at every fail."""
    agent, token = accounts.create_agent("churner", claim_queues=["churn"])
    # Its 6.4 MiB of errors at once: within its minute's 16 MiB, past the burst of 6 s (1.6 MiB).
    Agent.objects.filter(pk=agent.pk).update(burst_seconds=60)
    todo, _ = Todo.objects.create_todo(queue="churn", kind="k", max_attempts=1000)
    connections.close_all()
    error = "e" * (1024 * 1024 - 100)  # within MAX_JSON_BYTES with the error's JSON around it
    with agent_client(server, token) as client:
        for _ in range(100):
            [claimed] = client.post("/claim/", json={"ttl": 30}).json()["todos"]
            assert claimed["id"] == todo.id
            failed = client.post(f"/todos/{todo.id}/fail/", json={"error": error, "retry_in": 0})
            assert failed.status_code == 200, failed.text
    stored = Todo.objects.get(pk=todo.pk)
    assert (stored.attempt, len(stored.errors), stored.errors_dropped) == (100, 3, 97)
    assert [entry["attempt"] for entry in stored.errors] == [98, 99, 100]
    assert stored.errors_bytes <= 256 * 1024
    for entry in stored.errors:
        size = len(json.dumps(entry["error"], separators=(",", ":")).encode())
        assert 60 * 1024 < size <= 64 * 1024
        assert entry["error"]["note"].startswith("The error was 1048500 bytes of JSON")
    assert failed.json()["last_error"] == stored.errors[-1]["error"]


def test_an_agent_at_its_held_quota_is_throttled_and_claims_nothing(server: str) -> None:
    agent, token = accounts.create_agent("hoarder", claim_queues=["hoard"])
    Agent.objects.filter(pk=agent.pk).update(max_held=2)
    todos = [Todo.objects.create_todo(queue="hoard", kind="k")[0] for _ in range(3)]
    connections.close_all()
    with agent_client(server, token) as client:
        assert len(client.post("/claim/", json={"ttl": 30, "limit": 10}).json()["todos"]) == 2
        started = time.monotonic()
        refusals = [
            client.post("/claim/", json={"ttl": 30}),
            client.post("/claim/", json={"ttl": 30, "wait": 20}),
            client.post(f"/todos/{todos[2].id}/claim/", json={"ttl": 30}),
        ]
        elapsed = time.monotonic() - started
    for refused in refusals:
        assert refused.status_code == 429, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
        assert 25 <= int(refused.headers["Retry-After"]) <= 30  # when its first lease ends
        assert refused.json()["type"].endswith("#throttled")
        assert "holds 2 todos" in refused.json()["detail"]
    assert elapsed < 5  # the long poll is answered at once, not after its wait
    assert Todo.objects.get(pk=todos[2].pk).state == State.PENDING
    assert Todo.objects.filter(owner="hoarder").count() == 2


def test_creations_past_the_minute_quota_are_throttled_and_write_nothing(server: str) -> None:
    agent, token = accounts.create_agent("flooder", create_queues=["flood"])
    Agent.objects.filter(pk=agent.pk).update(max_creates_per_minute=5, burst_seconds=60)
    connections.close_all()
    with agent_client(server, token) as client:
        answers = [
            client.post("/todos/", json={"queue": "flood", "kind": "k", "payload": {"n": n}})
            for n in range(8)
        ]
    assert [answer.status_code for answer in answers] == [201] * 5 + [429] * 3
    assert 1 <= int(answers[5].headers["Retry-After"]) <= 60
    assert "no room for a todo now" in answers[5].json()["detail"]
    assert Todo.objects.filter(queue="flood").count() == 5


def test_max_attempts_above_the_agents_limit_is_refused(server: str) -> None:
    token = accounts.create_agent("retrier", create_queues=["retry"])[1]
    connections.close_all()
    with agent_client(server, token) as client:
        refused = client.post("/todos/", json={"queue": "retry", "kind": "k", "max_attempts": 1000})
        default = client.post("/todos/", json={"queue": "retry", "kind": "k"})
    assert refused.status_code == 422 and "at most 25" in refused.json()["detail"]
    assert default.status_code == 201 and default.json()["max_attempts"] == 5
    assert Todo.objects.filter(queue="retry").count() == 1


def test_an_agent_can_neither_squat_nor_read_a_producers_idempotency_key(server: str) -> None:
    token = accounts.create_agent("squatter", create_queues=["github", "handoff"])[1]
    secret, _ = Todo.objects.create_todo(
        queue="handoff", kind="internal", payload={"secret": 1}, idempotency_key="k-1"
    )
    connections.close_all()
    with agent_client(server, token) as client:
        squat = client.post(
            "/todos/", json={"queue": "github", "kind": "fake", "idempotency_key": "delivery-1"}
        )
        probe = client.post(
            "/todos/", json={"queue": "handoff", "kind": "probe", "idempotency_key": "k-1"}
        )
        again = client.post(
            "/todos/", json={"queue": "handoff", "kind": "probe", "idempotency_key": "k-1"}
        )
    assert squat.status_code == 201 and squat.json()["idempotency_key"] == "delivery-1"
    # The producer's delivery later is its own todo, not the agent's.
    real, created = Todo.objects.create_todo(
        queue="github", kind="github.push", idempotency_key="delivery-1"
    )
    assert created and real.id != squat.json()["id"]
    # The producer's todo with the same key stays unseen: the agent's is a todo of its own.
    assert probe.status_code == 201 and probe.json()["id"] != secret.id
    assert "secret" not in probe.text
    # Its own todo in a queue it cannot see: the key is taken, and no todo is shown.
    assert again.status_code == 409 and again.json()["type"].endswith("#todo-conflict")
    assert probe.json()["id"] not in again.text and "'k-1' is taken" in again.json()["detail"]


def test_an_agent_cannot_block_a_concurrency_key_it_cannot_see(server: str) -> None:
    token = accounts.create_agent("blocker", create_queues=["handoff"])[1]
    connections.close_all()
    with agent_client(server, token) as client:
        blocking = client.post(
            "/todos/",
            json={
                "queue": "handoff",
                "kind": "block",
                "concurrency_key": "repo-1",
                "assignee": "nobody",
                "priority": 100,
            },
        )
    assert blocking.status_code == 201 and blocking.json()["concurrency_key"] == "repo-1"
    work, _ = Todo.objects.create_todo(queue="internal", kind="k", concurrency_key="repo-1")
    assert Todo.objects.claim_next("internal", "worker", 60) == work


def test_a_claim_by_id_conflict_names_no_todo_of_another_queue(server: str) -> None:
    token = accounts.create_agent("prober", claim_queues=["work"])[1]
    Todo.objects.create_todo(queue="internal", kind="k", concurrency_key="c")
    holder = Todo.objects.claim_next("internal", "worker", 60)
    assert holder is not None
    waiting, _ = Todo.objects.create_todo(queue="work", kind="k", concurrency_key="c")
    connections.close_all()
    with agent_client(server, token) as client:
        refused = client.post(f"/todos/{waiting.id}/claim/", json={"ttl": 30})
    assert refused.status_code == 409
    assert "waits for its concurrency key" in refused.json()["detail"]
    assert holder.id not in refused.text


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


#: Requests whose paths hold control characters, bytes that are no UTF-8 or no route, and
#: methods their paths do not take: (method, path under /api/, status, problem type, Allow).
ODD_REQUESTS = [
    ("POST", "todos/%0A/heartbeat/", 422, "invalid-input", ""),
    ("POST", "todos/a%0Ab/complete/", 404, "todo-not-found", ""),
    ("POST", "todos/%1B%5B31m/release/", 404, "todo-not-found", ""),
    ("POST", "todos/%FF/fail/", 404, "todo-not-found", ""),
    ("POST", "todos/%0D%0A/claim/", 422, "invalid-input", ""),
    ("GET", "todos/a%0Ab/", 404, "todo-not-found", ""),
    ("GET", "todos/%0A/heartbeat/", 405, "method-not-allowed", "POST"),
    ("POST", "todos/%0A/", 405, "method-not-allowed", "GET"),
    ("DELETE", "todos/%FF%00/complete/", 405, "method-not-allowed", "POST"),
    ("PUT", "claim/", 405, "method-not-allowed", "POST"),
    ("POST", "todos/x/heartbeat/%0A", 404, "route-not-found", ""),
    ("PUT", "nowhere%0A", 404, "route-not-found", ""),
    ("POST", "%0A/", 404, "route-not-found", ""),
    ("GET", "%C0%AF%25/", 404, "route-not-found", ""),
    ("GET", "", 404, "route-not-found", ""),
    ("POST", "", 404, "route-not-found", ""),
]


@pytest.mark.parametrize("app", ["tests.asgi:application", "example_project.asgi:application"])
def test_every_answer_under_the_prefix_is_a_problem(
    subprocess_env: dict[str, str], app: str
) -> None:
    """Whatever the path holds, on the verbs answered in front of Django and through its URLs.

    Before, the example project's Starlette Mount("/") matched no path with a line break in
    it and answered a plain-text 404 itself (Schemathesis: undocumented content type), and the
    prefix itself was ninja's HTML 404, and a CSRF refusal of a POST. Outside the prefix, the
    project's own answers stay."""
    token = accounts.create_agent("odd", claim_queues=["work"])[1]
    connections.close_all()
    with serve(subprocess_env, app=app) as (base, process):
        with agent_client(base, token) as client:
            for method, path, status, kind, allow in ODD_REQUESTS:
                url = httpx.URL(f"{base}/{path}")
                answer = client.request(method, url, json={} if method == "POST" else None)
                seen = (method, path, answer.status_code, answer.headers.get("content-type"))
                assert seen[2:] == (status, "application/problem+json"), (seen, answer.text)
                assert answer.json()["type"].endswith(f"#{kind}"), seen
                assert answer.headers.get("allow", "") == allow, seen
            site = base.removesuffix("/api")
            for path in ["/nowhere%0A/", "/api%0A/"]:
                outside = client.get(httpx.URL(site + path))
                assert outside.status_code == 404
                assert outside.headers["content-type"].startswith("text/html")
        process.terminate()
        assert "Traceback" not in process.communicate(timeout=30)[0]
