"""The cap on an agent's requests in flight against the example project's ASGI application under
uvicorn, as a hostile agent would meet it: 120 creates at once from one token, each of which,
once admitted, queues on the agent's own row (held here by the test, as a long plan of the
agent's would hold it), while another agent works. An agent's creates take their turns on the
event loop (api/asgi.py): one at a time queues on its row, holding a thread and a connection.

The server's connections are counted in pg_stat_activity by their application_name. Nothing
here waits on the clock: the test holds the row until every refusal is in, so the creates that
were admitted are still queueing when they are counted.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import psycopg
import pytest
from django.db import connection, connections

from switchboard_todos.agents import accounts, errors
from switchboard_todos.models import Agent, State, Todo
from tests import test_long_polls_live as live
from tests.conftest import database_url
from tests.test_long_polls_live import SERVER, http_poll, mcp_polls, sqs_poll

pytestmark = pytest.mark.django_db(transaction=True)

#: The example project's application under uvicorn, its connections named SERVER.
start_server = live.start_server

#: The flood: concurrent creates of the hostile agent.
FLOOD = 120
#: The cap of the flood's server, and its pool: the pool is far above the cap, so that what
#: bounds the hostile agent's connections is the cap.
CAP = 8
POOL = 40
#: Todos the calm agent claims and completes while the flood is held.
CALM_TODOS = 20
#: How long anything here may take before the test fails (never a measure: a bound on a hang).
PATIENCE = 60.0


def queued_on_locks() -> int:
    """The server's connections waiting on a lock: the admitted creates, queueing on the row."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s AND wait_event_type = 'Lock'",
            [SERVER],
        )
        count: int = cursor.fetchone()[0]
    return count


@contextmanager
def row_held(agent: Agent) -> Iterator[None]:
    """The agent's row locked as a create of its own locks it (count its creations), from a
    connection of the test's own, until the block ends."""
    with psycopg.connect(database_url()) as holder:
        holder.execute("SELECT FROM todo_agents WHERE id = %s FOR NO KEY UPDATE", [agent.pk])
        yield
        holder.commit()


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, f"still not {what} after {PATIENCE} s"
        time.sleep(0.02)


class Creates:
    """`count` creates of one agent, each on a connection of its own, sent at once; each
    answer's status, Retry-After and problem detail as it comes back."""

    def __init__(self, base: str, token: str, count: int) -> None:
        self.answers: list[tuple[int, str | None, str]] = []
        self._lock = threading.Lock()
        self._ready = threading.Barrier(count + 1)
        self._threads = [
            threading.Thread(target=self._create, args=(base, token)) for _ in range(count)
        ]
        for thread in self._threads:
            thread.start()
        self._ready.wait(PATIENCE)

    def _create(self, base: str, token: str) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=base, headers=headers, timeout=PATIENCE * 2) as client:
            self._ready.wait(PATIENCE)
            answer = client.post("/api/todos/", json={"queue": "flood", "kind": "junk"})
        detail = answer.json().get("detail", "") if answer.status_code >= 400 else ""
        with self._lock:
            self.answers.append((answer.status_code, answer.headers.get("Retry-After"), detail))

    def answered(self) -> int:
        with self._lock:
            return len(self.answers)

    def join(self) -> list[tuple[int, str | None, str]]:
        for thread in self._threads:
            thread.join(PATIENCE)
        return self.answers


def agents() -> tuple[Agent, str, str]:
    """The hostile agent (creates in `flood`) and its token; the calm one's token, with a
    backlog of its own in `work`."""
    hostile, token = accounts.create_agent(
        "hostile", claim_queues=["flood"], create_queues=["flood"]
    )
    calm = accounts.create_agent("calm", claim_queues=["work"])[1]
    Todo.objects.enqueue_many({"queue": "work", "kind": "k"} for _ in range(CALM_TODOS))
    connections.close_all()
    return hostile, token, calm


def seen_now(base: str, token: str) -> None:
    """A request of the agent, so that its next ones do not mark it seen (a write on its row,
    once a minute)."""
    answer = httpx.get(f"{base}/api/todos/", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text


def calm_work(base: str, token: str) -> list[tuple[int, int]]:
    """The calm agent claims and completes its todos one at a time; each claim's and
    complete's status."""
    statuses = []
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=f"{base}/api", headers=headers, timeout=PATIENCE) as client:
        for _ in range(CALM_TODOS):
            claimed = client.post("/claim/", json={"queues": ["work"], "ttl": 60})
            todos = claimed.json()["todos"] if claimed.status_code == 200 else []
            done = client.post(f"/todos/{todos[0]['id']}/complete/", json={}) if todos else None
            statuses.append((claimed.status_code, done.status_code if done else 0))
    return statuses


def test_a_flood_of_creates_holds_one_connection(start_server: Callable[..., str]) -> None:
    """120 creates of one token at once, each admitted one queueing on the agent's row: CAP are
    admitted, of which one queues on the row, holding a connection, and the others wait their
    turn holding none; the other 112 are told to slow down at once; the calm agent claims and
    completes every one of its todos meanwhile."""
    hostile, token, calm = agents()
    base = start_server(
        DATABASE_POOL_SIZE=str(POOL), SWITCHBOARD_TODOS_AGENT_MAX_CONCURRENT=str(CAP)
    )
    seen_now(base, token)
    queued: list[int] = []
    held: list[int] = []
    with row_held(hostile):
        flood = Creates(base, token, FLOOD)
        calm_statuses: list[list[tuple[int, int]]] = []
        calm_agent = threading.Thread(target=lambda: calm_statuses.append(calm_work(base, calm)))
        calm_agent.start()

        def refused_and_counted() -> bool:
            queued.append(queued_on_locks())
            held.append(live.server_connections())
            return flood.answered() == FLOOD - CAP and queued[-1] == 1

        until(refused_and_counted, f"{FLOOD - CAP} refused and one queueing")
        calm_agent.join(PATIENCE)
        assert flood.answered() == FLOOD - CAP  # the admitted ones still queue
        queued.append(queued_on_locks())
        held.append(live.server_connections())
    answers = flood.join()
    assert max(queued) == 1, queued
    # The queueing create's, the calm agent's and the server's own (its LISTEN): not CAP.
    assert max(held) < CAP, held
    assert calm_statuses == [[(200, 200)] * CALM_TODOS]
    assert Counter(status for status, _, _ in answers) == {429: FLOOD - CAP, 201: CAP}
    refusals = [(wait, detail) for status, wait, detail in answers if status == 429]
    assert {wait for wait, _ in refusals} == {"1"}
    assert all("requests in flight" in detail for _, detail in refusals), refusals[0]
    assert Todo.objects.filter(queue="flood").count() == CAP
    assert Todo.objects.filter(queue="work", state=State.DONE).count() == CALM_TODOS


def test_past_the_cap_each_surface_answers_in_its_own_words(
    start_server: Callable[..., str],
) -> None:
    """With its cap of requests in flight taken by creates queueing on its row, the agent's next
    request is refused on every surface: the API's 429 problem (a route of Django's, and one
    answered in front of it), SQS's RequestThrottled, an MCP tool error; nothing is claimed."""
    hostile, token, _ = agents()
    Todo.objects.create_todo(queue="flood", kind="k")
    connections.close_all()
    base = start_server(SWITCHBOARD_TODOS_AGENT_MAX_CONCURRENT="2")
    seen_now(base, token)
    headers = {"Authorization": f"Bearer {token}"}
    listed: list[httpx.Response] = []

    def refused() -> bool:
        listed.append(httpx.get(f"{base}/api/todos/", headers=headers))
        return listed[-1].status_code == 429

    with row_held(hostile):
        creates = Creates(base, token, 2)
        until(lambda: queued_on_locks() == 1, "a create queueing")
        until(refused, "the other create in flight, waiting its turn")
        probes = [
            http_poll(base, token, "flood", 0),
            sqs_poll(base, hostile, "flood", 0, ready=lambda: None),
            *mcp_polls(base, token, "flood", 0, 1, ready=lambda: None),
        ]
        assert creates.answered() == 0
    assert [status for status, _, _ in creates.join()] == [201, 201]
    assert listed[-1].headers["Retry-After"] == "1"
    assert listed[-1].json()["type"] == errors.THROTTLED.type
    assert "requests in flight" in listed[-1].json()["detail"]
    assert probes == [("throttled", [])] * 3
    assert Todo.objects.filter(queue="flood", state=State.PENDING).count() == 3


def test_an_agents_fails_take_their_turns_while_its_row_is_held(
    start_server: Callable[..., str],
) -> None:
    """A fail counts against the agent's quota on its row, which a create of the agent holds
    until it commits. CAP fails of one token at once, while the row is held: one queues on the
    row, holding a thread and a connection, the others wait their turn on the event loop holding
    neither, and the calm agent claims and completes every one of its todos meanwhile. Waiting
    on the row on the API's threads, the fails took all of them, and the calm agent waited for
    the row too."""
    hostile, token, calm = agents()
    Todo.objects.enqueue_many({"queue": "flood", "kind": "k"} for _ in range(CAP))
    held = [todo.id for todo in Todo.objects.claim_batch(["flood"], "hostile", 600, CAP)]
    connections.close_all()
    base = start_server(
        DATABASE_POOL_SIZE=str(POOL), SWITCHBOARD_TODOS_AGENT_MAX_CONCURRENT=str(CAP)
    )
    seen_now(base, token)
    statuses: list[int] = []
    calm_statuses: list[list[tuple[int, int]]] = []
    queued: list[int] = []

    def fail(todo_id: str) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=f"{base}/api", headers=headers, timeout=PATIENCE * 2) as client:
            statuses.append(client.post(f"/todos/{todo_id}/fail/", json={"error": "e"}).status_code)

    fails = [threading.Thread(target=fail, args=(todo_id,)) for todo_id in held]
    with row_held(hostile):
        for thread in fails:
            thread.start()
        until(lambda: queued_on_locks() >= 1, "a fail queueing on the row")
        calm_agent = threading.Thread(target=lambda: calm_statuses.append(calm_work(base, calm)))
        calm_agent.start()
        calm_agent.join(PATIENCE)
        worked_meanwhile = not calm_agent.is_alive()
        queued.append(queued_on_locks())
        assert not statuses  # every fail still waits for the row, or its turn
    for thread in [*fails, calm_agent]:
        thread.join(PATIENCE)
    assert worked_meanwhile and queued == [1], queued
    assert calm_statuses == [[(200, 200)] * CALM_TODOS]
    assert statuses == [200] * CAP
    assert Todo.objects.filter(queue="flood", state=State.PENDING).count() == CAP
