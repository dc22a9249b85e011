"""AgentsAPIFirst (api/asgi.py) answers the agent loop's verbs exactly as Django's views do.

Each case is sent twice, on the same fresh todos: through Django's ASGI handler (the API's
views, api/views.py) and through AgentsAPIFirst. The status, the body, the problem's headers and
what the table holds afterwards must be the same, ids and times aside.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from switchboard_todos.agents import accounts
from switchboard_todos.api import asgi
from switchboard_todos.claims import long_polls
from switchboard_todos.exceptions import NotAuthenticated
from switchboard_todos.models import Agent, State, Todo
from tests.asgi import django_application

pytestmark = pytest.mark.django_db(transaction=True)

ASGIApp = Callable[..., Any]


class Answer(NamedTuple):
    status: int
    headers: dict[str, str]
    body: bytes


def call(
    app: ASGIApp, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> Answer:
    """One request to an ASGI application, in process."""
    sent: list[dict[str, Any]] = []
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (name.lower().encode("latin1"), value.encode("latin1"))
            for name, value in {"Host": "testserver", **(headers or {})}.items()
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }

    async def run() -> None:
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        gone = asyncio.Event()

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop()
            await gone.wait()  # the client stays until the answer is sent
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(scope, receive, send)

    asyncio.run(run())
    start, *parts = sent
    answer_headers = {name.decode().lower(): value.decode() for name, value in start["headers"]}
    return Answer(
        start["status"], answer_headers, b"".join(part.get("body", b"") for part in parts)
    )


@pytest.fixture
def fast() -> Iterator[asgi.AgentsAPIFirst]:
    app = asgi.AgentsAPIFirst(django_application, threads=2)
    yield app
    app.close()
    long_polls.stop()  # the long polls' listener and claim threads, before the database goes


@pytest.fixture
def tokens() -> dict[str, str]:
    """a1 claims from work and more, and creates in work; a2 claims from work; gone was
    revoked."""
    made = {
        "a1": accounts.create_agent("a1", claim_queues=["work", "more"], create_queues=["work"])[1],
        "a2": accounts.create_agent("a2", claim_queues=["work"])[1],
        "gone": accounts.create_agent("gone", claim_queues=["work"])[1],
    }
    accounts.revoke(Agent.objects.get(name="gone"))
    return made


#: The todos each case starts from, by label: the label stands for the id in every answer.
TODOS: dict[str, dict[str, Any]] = {
    "T_pending": {"queue": "work", "kind": "k"},
    "T_held_a1": {"queue": "work", "kind": "k", "state": State.CLAIMED, "owner": "a1"},
    "T_held_a2": {"queue": "work", "kind": "k", "state": State.CLAIMED, "owner": "a2"},
    "T_for_a2": {"queue": "work", "kind": "k", "assignee": "a2"},
    "T_secret": {"queue": "secret", "kind": "k"},
}


def make_todos(make_todo: Callable[..., Todo]) -> dict[str, str]:
    """The todos of TODOS, afresh; {id: label}."""
    Todo.objects.all().delete()
    return {make_todo(**fields).id: label for label, fields in TODOS.items()}


_TIME = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?\+00:00")
#: A todo's id: one the case made is <new>.
_ID = re.compile(r"td_[0-9A-Za-z-]+")


def normal(answer: Answer, labels: dict[str, str]) -> tuple[Any, ...]:
    """What must be equal both ways: ids as labels, times as <time>."""
    body = _TIME.sub("<time>", answer.body.decode())
    for todo_id, label in labels.items():
        body = body.replace(todo_id, label)
    body = _ID.sub(lambda found: found[0] if found[0] in labels else "<new>", body)
    table = sorted(
        (
            labels.get(todo.id, "new"),
            todo.state,
            todo.owner,
            todo.attempt,
            json.dumps(todo.result),
            _TIME.sub("<time>", json.dumps(todo.errors)),
            todo.lease_expires_at is None,
            todo.next_retry_at is None,
        )
        for todo in Todo.objects.with_errors()
    )
    shown = {
        k: _ID.sub("<new>", v)
        for k, v in answer.headers.items()
        if k in ("content-type", "www-authenticate", "location")
    }
    return answer.status, shown, json.loads(body) if body else None, table


@pytest.fixture
def both_ways(
    fast: asgi.AgentsAPIFirst, make_todo: Callable[..., Todo]
) -> Callable[[str, bytes, dict[str, str]], tuple[Any, Any]]:
    """Send a POST through Django's handler, then through AgentsAPIFirst, each time on fresh
    todos; what each answered and left in the table, normalised (`normal`)."""

    def send(path: str, body: bytes, headers: dict[str, str]) -> tuple[Any, Any]:
        answers = []
        for app in (django_application, fast):
            labels = make_todos(make_todo)
            path_here = path
            for todo_id, label in labels.items():
                path_here = path_here.replace(label, todo_id)
            answers.append(normal(call(app, "POST", path_here, body, headers), labels))
            connections.close_all()
        return answers[0], answers[1]

    return send


#: A body each verb and create takes, by path; each is also sent misshapen (MISSHAPEN).
VALID = {
    "claim/": b'{"queues": ["work"], "ttl": 30, "limit": 10}',
    "todos/T_pending/claim/": b'{"ttl": 30}',
    "todos/T_held_a1/heartbeat/": b'{"ttl": 60}',
    "todos/T_held_a1/complete/": b'{"result": {"ok": true}}',
    "todos/T_held_a1/fail/": b'{"error": {"message": "boom"}, "retry_in": 5}',
    "todos/T_held_a1/release/": b'{"delay": 10}',
    "todos/": b'{"queue": "work", "kind": "k", "payload": {"n": 1}}',
    "todos/batch/": b'{"todos": [{"queue": "work", "kind": "k", "ref": "a"},'
    b' {"queue": "work", "kind": "m", "after": ["a"]}]}',
}
#: What becomes of a valid body (a JSON object) sent misshapen: the same to every path.
MISSHAPEN: dict[str, Callable[[bytes], bytes]] = {
    "no body": lambda body: b"",
    "not JSON": lambda body: body[:-1],
    "an owner in the body": lambda body: body[:-1] + b', "owner": "a2"}',
}

CASES: list[tuple[str, str, bytes, str]] = [
    *((f"ok {path}", path, body, "a1") for path, body in VALID.items()),
    *(
        (f"{path}, {shape}", path, misshape(body), "a1")
        for path, body in VALID.items()
        for shape, misshape in MISSHAPEN.items()
    ),
    ("claim, default queues", "claim/", b'{"ttl": 30}', "a1"),
    ("claim, nothing claimable", "claim/", b'{"queues": ["more"], "ttl": 30}', "a1"),
    (
        "claim, a long poll that ends empty",
        "claim/",
        b'{"queues": ["more"], "ttl": 30, "wait": 1}',
        "a1",
    ),
    ("claim, queue not granted", "claim/", b'{"queues": ["secret"], "ttl": 30}', "a1"),
    ("claim, wait too long", "claim/", b'{"ttl": 30, "wait": 21}', "a1"),
    ("claim, limit too high", "claim/", b'{"ttl": 30, "limit": 11}', "a1"),
    ("claim, ttl of zero", "claim/", b'{"ttl": 0}', "a1"),
    ("claim, ttl as text", "claim/", b'{"ttl": "30"}', "a1"),
    ("claim, queues not a list", "claim/", b'{"queues": "work", "ttl": 30}', "a1"),
    ("claim, a list", "claim/", b"[1]", "a1"),
    (
        "claim, nested too deep",
        "claim/",
        b'{"ttl": 30, "x": ' + b"[" * 200 + b"]" * 200 + b"}",
        "a1",
    ),
    ("claim, a lone surrogate", "claim/", b'{"ttl": 30, "queues": ["\\ud800"]}', "a1"),
    ("claim, too large", "claim/", b'{"ttl": 30, "x": "' + b"x" * 3_000_000 + b'"}', "a1"),
    ("claim by id, assigned to another", "todos/T_for_a2/claim/", b'{"ttl": 30}', "a1"),
    ("claim by id, assigned to me", "todos/T_for_a2/claim/", b'{"ttl": 30}', "a2"),
    ("claim by id, another queue", "todos/T_secret/claim/", b'{"ttl": 30}', "a1"),
    ("claim by id, held by another", "todos/T_held_a2/claim/", b'{"ttl": 30}', "a1"),
    ("claim by id, unknown", "todos/td_unknown/claim/", b'{"ttl": 30}', "a1"),
    ("claim by id, an id too long", "todos/" + "x" * 300 + "/claim/", b'{"ttl": 30}', "a1"),
    ("heartbeat, held by another", "todos/T_held_a2/heartbeat/", b'{"ttl": 60}', "a1"),
    ("heartbeat, not held", "todos/T_pending/heartbeat/", b'{"ttl": 60}', "a1"),
    ("heartbeat, another queue", "todos/T_secret/heartbeat/", b'{"ttl": 60}', "a1"),
    ("complete, held by another", "todos/T_held_a2/complete/", b"{}", "a1"),
    ("complete, pending", "todos/T_pending/complete/", b"{}", "a1"),
    ("complete, unknown", "todos/td_unknown/complete/", b"{}", "a1"),
    ("complete, a field it does not take", "todos/T_held_a1/complete/", b'{"error": "x"}', "a1"),
    ("fail, retry_in negative", "todos/T_held_a1/fail/", b'{"retry_in": -1}', "a1"),
    ("fail, error a number", "todos/T_held_a1/fail/", b'{"error": 3}', "a1"),
    ("release, delay as text", "todos/T_held_a1/release/", b'{"delay": "soon"}', "a1"),
    ("release, held by another", "todos/T_held_a2/release/", b"{}", "a1"),
    (
        "create, after a todo",
        "todos/",
        b'{"queue": "work", "kind": "k", "after": ["T_pending"]}',
        "a1",
    ),
    (
        "create, after an unknown todo",
        "todos/",
        b'{"queue": "work", "kind": "k", "after": ["td_unknown"]}',
        "a1",
    ),
    ("create, a queue not granted", "todos/", b'{"queue": "secret", "kind": "k"}', "a1"),
    ("create, no create queues", "todos/", b'{"queue": "work", "kind": "k"}', "a2"),
    ("create, no queue", "todos/", b'{"kind": "k"}', "a1"),
    ("plan, empty", "todos/batch/", b'{"todos": []}', "a1"),
    (
        "plan, a cycle",
        "todos/batch/",
        b'{"todos": [{"queue": "work", "kind": "k", "ref": "a", "after": ["b"]},'
        b' {"queue": "work", "kind": "m", "ref": "b", "after": ["a"]}]}',
        "a1",
    ),
]
#: Each way of sending no valid token; None: the token of a revoked agent.
AUTH: dict[str, dict[str, str] | None] = {
    "none": {},
    "basic": {"Authorization": "Basic YTpi"},
    "empty": {"Authorization": "Bearer "},
    "malformed": {"Authorization": "Bearer sbt_wrong"},
    "unknown": {"Authorization": "Bearer sbt_" + "A" * 43},
    "revoked": None,
}


@pytest.mark.parametrize(("name", "path", "body", "agent"), CASES, ids=[case[0] for case in CASES])
def test_same_answer_both_ways(
    both_ways: Callable[..., tuple[Any, Any]],
    tokens: dict[str, str],
    name: str,
    path: str,
    body: bytes,
    agent: str,
) -> None:
    headers = {"Authorization": f"Bearer {tokens[agent]}", "Content-Type": "application/json"}
    through_django, through_fast = both_ways(f"/api/{path}", body, headers)
    assert through_fast == through_django


@pytest.mark.parametrize("auth", AUTH, ids=list(AUTH))
@pytest.mark.parametrize("path", ["claim/", "todos/T_held_a1/complete/", "todos/"])
def test_same_refusal_of_a_token_both_ways(
    both_ways: Callable[..., tuple[Any, Any]], tokens: dict[str, str], auth: str, path: str
) -> None:
    headers = AUTH[auth]
    if headers is None:
        headers = {"Authorization": f"Bearer {tokens['gone']}"}
    through_django, through_fast = both_ways(f"/api/{path}", b'{"ttl": 30}', headers)
    assert through_fast == through_django
    assert through_fast[0] == 401


def test_a_host_not_allowed_is_djangos_400(
    fast: asgi.AgentsAPIFirst, tokens: dict[str, str]
) -> None:
    headers = {"Authorization": f"Bearer {tokens['a1']}", "Host": "evil.example"}
    answer = call(fast, "POST", "/api/claim/", b'{"ttl": 30}', headers)
    assert answer.status == 400
    assert Todo.objects.filter(state=State.CLAIMED).count() == 0


def test_an_answer_in_front_says_its_length(
    fast: asgi.AgentsAPIFirst, tokens: dict[str, str]
) -> None:
    """Not chunked: a client reads the body in one piece (http.client, in the agents' bench)."""
    Todo.objects.create_todo(queue="work", kind="k")
    mine = {"Authorization": f"Bearer {tokens['a1']}"}
    for answer in (
        call(fast, "POST", "/api/claim/", b'{"ttl": 30}', mine),
        call(fast, "POST", "/api/claim/", b'{"ttl": "soon"}', mine),
        call(fast, "POST", "/api/claim/", b'{"ttl": 30}', {"Authorization": "Bearer nope"}),
    ):
        assert "transfer-encoding" not in answer.headers
        assert int(answer.headers["content-length"]) == len(answer.body) > 0


def test_only_the_verbs_and_creates_are_answered_in_front(tokens: dict[str, str]) -> None:
    """List, get, the schema and other methods reach the wrapped application."""
    reached: list[tuple[str, str]] = []

    async def behind(scope: dict[str, Any], receive: Any, send: Any) -> None:
        reached.append((scope["method"], scope["path"]))
        await django_application(scope, receive, send)

    app = asgi.AgentsAPIFirst(behind, threads=1)
    try:
        headers = {"Authorization": f"Bearer {tokens['a1']}"}
        Todo.objects.create_todo(queue="work", kind="k")
        assert call(app, "POST", "/api/claim/", b'{"ttl": 30}', headers).status == 200
        create = b'{"queue": "work", "kind": "k"}'
        assert call(app, "POST", "/api/todos/", create, headers).status == 201
        plan = b'{"todos": [{"queue": "work", "kind": "k"}]}'
        assert call(app, "POST", "/api/todos/batch/", plan, headers).status == 201
        assert call(app, "GET", "/api/todos/", b"", headers).status == 200
        assert call(app, "GET", "/api/claim/", b"", headers).status == 405
        assert call(app, "GET", "/api/openapi.json").status == 200
        assert call(app, "POST", "/admin/login/").status in (200, 403)
    finally:
        app.close()
    assert reached == [
        ("GET", "/api/todos/"),
        ("GET", "/api/claim/"),
        ("GET", "/api/openapi.json"),
        ("POST", "/admin/login/"),
    ]


def test_a_verb_is_one_statement(tokens: dict[str, str]) -> None:
    """The transition alone, which checks the agent's credential itself, once this process
    has read the agent (the first request reads it)."""
    first, _ = Todo.objects.create_todo(queue="work", kind="k")
    second, _ = Todo.objects.create_todo(queue="work", kind="k")
    counted = []
    for todo in (first, second):
        with CaptureQueriesContext(connection) as claim:
            asgi._perform("claim", tokens["a1"], None, b'{"ttl": 30}', {})
        with CaptureQueriesContext(connection) as complete:
            asgi._perform("complete", tokens["a1"], todo.id, b"", {})
        counted.append((len(claim), len(complete)))
    assert counted == [(2, 1), (1, 1)]
    assert Todo.objects.get(pk=first.pk).state == Todo.objects.get(pk=second.pk).state == "done"


def test_without_keeping_agents_each_request_reads_its_agent(
    tokens: dict[str, str], settings: Any
) -> None:
    settings.SWITCHBOARD_TODOS_AGENT_CACHE_SECONDS = 0
    todo, _ = Todo.objects.create_todo(queue="work", kind="k")
    with CaptureQueriesContext(connection) as claim:
        asgi._perform("claim", tokens["a1"], None, b'{"ttl": 30}', {})
    with CaptureQueriesContext(connection) as complete:
        asgi._perform("complete", tokens["a1"], todo.id, b"", {})
    assert (len(claim), len(complete)) == (2, 2)


@pytest.mark.parametrize("verb", ["complete", "heartbeat", "fail", "release", "claim"])
@pytest.mark.parametrize("revoke", [accounts.revoke, accounts.rotate_token])
def test_a_revoked_token_is_refused_at_its_very_next_request(
    tokens: dict[str, str], revoke: Callable[[Agent], Any], verb: str
) -> None:
    """Read by this process a moment before, the agent is revoked (or its token rotated): its
    next request is refused (401), and changes nothing."""
    held, _ = Todo.objects.create_todo(queue="work", kind="k")
    waiting, _ = Todo.objects.create_todo(queue="work", kind="k")
    token = tokens["a1"]
    asgi._perform("claim", token, None, b'{"ttl": 30}', {})
    revoke(Agent.objects.get(name="a1"))
    with pytest.raises(NotAuthenticated):
        asgi._perform(verb, token, None if verb == "claim" else held.id, b"{}", {})
    held.refresh_from_db()
    assert (held.state, held.owner, held.attempt) == (State.CLAIMED, "a1", 1)
    assert Todo.objects.get(pk=waiting.pk).state == State.PENDING


def test_a_terminated_connection_costs_one_answer(tokens: dict[str, str]) -> None:
    """The backend of the thread's kept connection is killed: that request answers 503 (a
    problem, no traceback), the connection is closed, and the next request works."""
    app = asgi.AgentsAPIFirst(django_application, threads=1)
    headers = {"Authorization": f"Bearer {tokens['a1']}"}
    try:
        for _ in range(3):
            Todo.objects.create_todo(queue="work", kind="k")
        assert call(app, "POST", "/api/claim/", b'{"ttl": 30}', headers).status == 200
        kept = app._threads.submit(lambda: connection.connection.info.backend_pid).result()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [kept])
        broken = call(app, "POST", "/api/claim/", b'{"ttl": 30}', headers)
        assert broken.status == 503 and broken.headers["retry-after"] == "5"
        assert broken.headers["content-type"] == "application/problem+json"
        assert call(app, "POST", "/api/claim/", b'{"ttl": 30}', headers).status == 200
    finally:
        app.close()
    assert Todo.objects.filter(state=State.CLAIMED, owner="a1").count() == 2


@pytest.mark.parametrize("wait", [0, 1], ids=["claim", "long poll"])
def test_a_merge_reads_its_parents_results_both_ways(
    fast: asgi.AgentsAPIFirst, tokens: dict[str, str], make_todo: Callable[..., Todo], wait: int
) -> None:
    """A claimed todo's answer holds its parents' results, read off the event loop (on the
    API's threads), after a long poll too."""
    headers = {"Authorization": f"Bearer {tokens['a1']}", "Content-Type": "application/json"}
    body = json.dumps({"queues": ["work"], "ttl": 30, "wait": wait}).encode()
    for app in (django_application, fast):
        Todo.objects.all().delete()
        part = make_todo(queue="work", state=State.DONE, result={"n": 1})
        merge, _ = Todo.objects.create_todo(queue="work", kind="merge", after=[part.id])
        connections.close_all()
        answer = call(app, "POST", "/api/claim/", body, headers)
        assert answer.status == 200, answer.body
        [claimed] = json.loads(answer.body)["todos"]
        assert (claimed["id"], claimed["parents"]) == (merge.id, [part.id])
        assert claimed["parent_results"] == {part.id: {"n": 1}}


@pytest.mark.parametrize("wait", [0, 1], ids=["claim", "long poll"])
def test_a_retry_shows_its_last_error_both_ways(
    fast: asgi.AgentsAPIFirst, tokens: dict[str, str], make_todo: Callable[..., Todo], wait: int
) -> None:
    """A claimed todo's answer holds the last error of its failure history, read off the event
    loop (on the API's threads), after a long poll too."""
    headers = {"Authorization": f"Bearer {tokens['a1']}", "Content-Type": "application/json"}
    body = json.dumps({"queues": ["work"], "ttl": 30, "wait": wait}).encode()
    for app in (django_application, fast):
        Todo.objects.all().delete()
        todo = make_todo(queue="work", state=State.CLAIMED, owner="w0")
        Todo.objects.fail(todo.id, "w0", {"type": "Boom", "message": "first try"}, retry_in=0)
        connections.close_all()
        answer = call(app, "POST", "/api/claim/", body, headers)
        assert answer.status == 200, answer.body
        [claimed] = json.loads(answer.body)["todos"]
        assert claimed["id"] == todo.id
        assert claimed["last_error"] == {"type": "Boom", "message": "first try"}
