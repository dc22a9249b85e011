"""Fair claims: within a priority, the fair keys of a queue take turns (docs/queues.md).

Each todo with a fair key takes a turn (fair_at) when it is written: the queue's head, or one
step after its key's last pending todo, whichever is later. The claim takes the earliest turns,
so it spreads over the keys, rotates, and finds a quiet key's todo ahead of a backlog, at the
cost of the plain claim.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

import pytest
from django.db import connection

from switchboard_todos.claims.marks import marks
from switchboard_todos.models import State, Todo
from switchboard_todos.sql import queries
from tests.conftest import run_in_threads
from tests.test_sql import claim_params, explain_generic, nodes

KEYS = ["acme", "globex", "initech", "umbrella"]


def enqueue(key: str | None, count: int, queue: str = "default") -> list[Todo]:
    """`count` todos of `key` in one create_many, in order."""
    made = Todo.objects.create_many(
        [{"queue": queue, "kind": "k", "fair_key": key, "payload": {"n": n}} for n in range(count)]
    )
    return [todo for todo, _ in made]


def keys_of(todos: list[Todo]) -> Counter[str | None]:
    return Counter(todo.fair_key for todo in todos)


@pytest.fixture(autouse=True)
def no_marks() -> None:
    """Each test starts with a full scan: marks of an earlier test's rows do not apply."""
    marks.forget()


@pytest.mark.django_db
def test_a_claim_takes_at_most_its_share_from_each_key_while_the_others_have_some() -> None:
    """Four keys with a backlog each, claimed ten at a time: no key gets more than
    ceil(10 / 4) = 3 of a claim, batch after batch, until one runs out."""
    for key in KEYS:
        enqueue(key, 30)
    claimed = 0
    while claimed < 100:
        batch = Todo.objects.claim_batch("default", "w1", 30, 10)
        assert len(batch) == 10
        assert max(keys_of(batch).values()) <= math.ceil(10 / len(KEYS))
        claimed += len(batch)


@pytest.mark.django_db
def test_a_querysets_claim_takes_turns_too() -> None:
    """The ORM-narrowed claim ranks its candidates by turn as claim_next does."""
    for key in KEYS:
        enqueue(key, 10)
    enqueue(None, 5, queue="other")
    batch = Todo.objects.filter(queue="default").claim_batch("w1", 30, 8)
    assert keys_of(batch) == dict.fromkeys(KEYS, 2)


@pytest.mark.django_db
def test_the_claim_is_work_conserving() -> None:
    """A key alone takes every place; once the others run out, the rest go to whoever has
    todos left."""
    enqueue("acme", 30)
    assert keys_of(Todo.objects.claim_batch("default", "w1", 30, 10)) == {"acme": 10}
    enqueue("globex", 2)
    assert keys_of(Todo.objects.claim_batch("default", "w1", 30, 10)) == {
        "acme": 8,
        "globex": 2,
    }


@pytest.mark.django_db
def test_single_claims_rotate_across_keys_and_each_key_goes_oldest_first() -> None:
    made = {key: enqueue(key, 3) for key in KEYS}
    claims = [Todo.objects.claim_next("default", "w1", 30) for _ in range(12)]
    order = [todo.fair_key for todo in claims if todo is not None]
    assert [set(order[turn : turn + 4]) for turn in (0, 4, 8)] == [set(KEYS)] * 3
    # In turn order. (Keys level at a turn, as these are, go in the order the index holds them,
    # which follows where their rows landed in the table: not necessarily the same each turn.)
    turns = [todo.fair_at for todo in claims if todo is not None]
    assert turns == sorted(turns)
    for key in KEYS:
        mine = [todo.id for todo in claims if todo is not None and todo.fair_key == key]
        assert mine == [todo.id for todo in made[key]]


@pytest.mark.django_db
def test_a_quiet_keys_todo_goes_ahead_of_another_keys_backlog() -> None:
    """Within a priority a claim is FIFO for one key, not for the queue: a todo of a key with
    nothing waiting starts level with the head of the backlog."""
    enqueue("import", 500)
    Todo.objects.claim_batch("default", "w1", 30, 5)
    (quiet,) = enqueue("customer-42", 1)
    assert quiet.id in {todo.id for todo in Todo.objects.claim_batch("default", "w1", 30, 2)}


@pytest.mark.django_db
def test_todos_without_a_key_share_one_lane_in_creation_order() -> None:
    made = enqueue(None, 5) + enqueue(None, 5)
    assert [todo.fair_at for todo in made] == [todo.created_at for todo in made]
    claimed = Todo.objects.claim_batch("default", "w1", 30, 10)
    assert [todo.id for todo in claimed] == [todo.id for todo in made]


@pytest.mark.django_db
def test_keys_take_turns_within_one_batch_and_across_paths() -> None:
    """create_many numbers each key's rows of a batch from its key's turn; create_todo and
    enqueue_many give the same turns."""
    batch = Todo.objects.create_many(
        [{"kind": "k", "fair_key": key} for key in ["a", "a", "a", "b"]]
    )
    a1, a2, a3, b1 = (todo for todo, _ in batch)
    assert (a2.fair_at - a1.fair_at).total_seconds() == 0.001
    assert (a3.fair_at - a2.fair_at).total_seconds() == 0.001
    assert b1.fair_at == a1.fair_at
    one, _ = Todo.objects.create_todo(kind="k", fair_key="c")
    assert one.fair_at == a1.fair_at
    Todo.objects.enqueue_many([{"kind": "k", "fair_key": "d"}, {"kind": "k", "fair_key": "a"}])
    d1 = Todo.objects.get(fair_key="d")
    a4 = Todo.objects.filter(fair_key="a").order_by("-fair_at").first()
    assert d1.fair_at == a1.fair_at
    assert a4 is not None and (a4.fair_at - a3.fair_at).total_seconds() == 0.001
    for stored in Todo.objects.filter(pk__in=[a1.pk, a2.pk, a3.pk, b1.pk, one.pk]):
        assert (
            stored.fair_at == {todo.pk: todo.fair_at for todo in (a1, a2, a3, b1, one)}[stored.pk]
        )


@pytest.mark.django_db
def test_each_priority_is_its_own_round() -> None:
    """A higher priority still goes first; a key's backlog at one priority does not push its
    todos at another back."""
    enqueue("big", 50)
    urgent, _ = Todo.objects.create_todo(kind="k", fair_key="big", priority=5)
    other, _ = Todo.objects.create_todo(kind="k", fair_key="small", priority=5)
    first = Todo.objects.claim_batch("default", "w1", 30, 2)
    assert {todo.id for todo in first} == {urgent.id, other.id}


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["fail", "release"])
def test_a_retry_takes_a_new_turn_behind_its_keys_backlog(how: str) -> None:
    """A key that fails its todo with retry_in 0, or gives it back, waits for its turn again:
    behind its own todos already waiting, while the other keys' turns come first."""
    mine = enqueue("flaky", 3)
    theirs = enqueue("steady", 3)
    taken = Todo.objects.claim_next("default", "w1", 30)
    assert taken is not None and taken.id == mine[0].id
    if how == "fail":
        again = Todo.objects.fail(taken.id, "w1", "boom", retry_in=0)
    else:
        again = Todo.objects.release(taken.id, "w1")
    assert again.fair_at > max(todo.fair_at for todo in mine)
    order = []
    while (todo := Todo.objects.claim_next("default", "w1", 30)) is not None:
        order.append(todo.id)
    assert order.index(mine[0].id) > order.index(mine[2].id)
    assert order.index(mine[0].id) > order.index(theirs[2].id)


@pytest.mark.django_db(transaction=True)
def test_concurrent_claimers_each_take_their_share() -> None:
    """Exact under concurrency: four claimers racing for batches of ten over five keys take
    the first 480 turns, 96 of each key, and no todo twice. A single batch may reach past rows
    another claimer holds locked (SKIP LOCKED), so one batch can hold a third of a key; the
    turns taken together cannot."""
    keys = [f"tenant-{n}" for n in range(5)]
    for key in keys:
        enqueue(key, 200)

    def claim(index: int) -> list[list[Todo]]:
        return [Todo.objects.claim_batch("default", f"w{index}", 30, 10) for _ in range(12)]

    batches = [batch for batches in run_in_threads(4, claim) for batch in batches]
    assert sum(map(len, batches)) == 480
    assert keys_of([todo for batch in batches for todo in batch]) == dict.fromkeys(keys, 96)
    ids = [todo.id for batch in batches for todo in batch]
    assert len(ids) == len(set(ids))
    assert Todo.objects.filter(state=State.CLAIMED).count() == 480


def claim_buffers(backlog_keys: int) -> tuple[int, int]:
    """A backlog of 100,000 todos over `backlog_keys` fair keys; the claim of ten from it:
    the buffers it touched, and the rows its scans of idx_todos_pending read."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO todos (queue, kind, fair_key, fair_at)
            SELECT 'fair', 'k', 'key-' || g %% %s,
                   now() + (g / %s) * interval '1 millisecond'
              FROM generate_series(1, 100000) AS g
            """,
            [backlog_keys, backlog_keys],
        )
        cursor.execute("ANALYZE todos")
        params = claim_params(["fair"], 10)
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {queries['claim_next']}", params)
        (plan,) = cursor.fetchone()
        cursor.execute("DELETE FROM todos WHERE queue = 'fair'")
        # ANALYZE writes its statistics in place, kept past the test's rollback: those of an
        # empty table again, as the next tests expect.
        cursor.execute("ANALYZE todos")
    root = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]

    def walk(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node, *(found for child in node.get("Plans", []) for found in walk(child))]

    read = sum(
        node["Actual Rows"] * node["Actual Loops"]
        for node in walk(root)
        if node.get("Index Name") == "idx_todos_pending"
    )
    return root["Shared Hit Blocks"] + root["Shared Read Blocks"], read


@pytest.mark.django_db
def test_a_backlog_under_one_key_costs_the_claim_no_more_than_ten_keys_do(
    vacuumed: None,
) -> None:
    """The claim reads the head of the queue's index in turn order, whoever the backlog
    belongs to: never one probe per key, never the backlog."""
    one_buffers, one_read = claim_buffers(1)
    ten_buffers, ten_read = claim_buffers(10)
    assert one_read <= 10 and ten_read <= 10
    assert one_buffers <= ten_buffers * 1.5


@pytest.mark.django_db
def test_each_agent_is_a_tenant_and_its_keys_are_its_own() -> None:
    """A todo an agent creates counts for the agent, or for the agent's own key: one agent's
    backlog does not hold up another's todo, and no agent can join another tenant's turns."""
    from switchboard_todos.agents import accounts, service
    from switchboard_todos.agents.serialize import todo_json

    busy = accounts.create_agent("busy", create_queues=["default"])[0]
    calm = accounts.create_agent("calm", create_queues=["default"])[0]
    service.create_many_for(busy, todos=[{"queue": "default", "kind": "k"}] * 50)
    mine, _ = service.create_for(calm, queue="default", kind="k")
    keyed, _ = service.create_for(calm, queue="default", kind="k", fair_key="customer-42")
    producer, _ = Todo.objects.create_todo(kind="k", fair_key="agent:calm/customer-42")
    assert (mine.fair_key, keyed.fair_key) == ("agent:calm", "agent:calm/customer-42")
    assert (todo_json(mine)["fair_key"], todo_json(keyed)["fair_key"]) == (None, "customer-42")
    assert todo_json(producer)["fair_key"] == "agent:calm/customer-42"
    taken = {todo.id for todo in Todo.objects.claim_batch("default", "w1", 30, 3)}
    assert {mine.id, keyed.id} <= taken


@pytest.mark.django_db
@pytest.mark.parametrize("statement", ["create_todo", "fair_turns"])
def test_a_keyed_creates_probes_are_index_scans_in_the_generic_plan(
    vacuumed: None, statement: str
) -> None:
    """The turn of a todo with a fair key reads one entry of idx_todos_pending and one of
    idx_todos_lane, in the one generic plan a prepared statement keeps (cursors.py): never a
    scan of the backlog, whose size the plan does not know."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO todos (kind, fair_key, fair_at)"
            " SELECT 'k', 'key-' || g % 100, now() + g * interval '1 millisecond'"
            "   FROM generate_series(1, 60000) AS g"
        )
        cursor.execute("ANALYZE todos")
    params = {
        "queue": "default",
        "source": "",
        "kind": "k",
        "title": "",
        "payload": "{}",
        "event_id": None,
        "idempotency_key": None,
        "assignee": None,
        "max_attempts": None,
        "default_max_attempts": 5,
        "priority": 0,
        "concurrency_key": None,
        "fair_key": "key-7",
        "run_after": None,
        "notify": False,
        "trace_context": None,
        "queues": "{default}",
        "priorities": "{0}",
        "keys": "{key-7}",
    }
    plan = explain_generic(statement, params)
    reads = {
        (node["Node Type"], node.get("Index Name"))
        for node in nodes(plan)
        if node.get("Relation Name") == "todos" and node["Node Type"] != "ModifyTable"
    }
    # (and create_todo's look-up of the live todo holding its key, by idx_todos_dedupe)
    assert {"idx_todos_pending", "idx_todos_lane"} <= {index for _, index in reads}, reads
    assert {index for _, index in reads} <= {
        "idx_todos_pending",
        "idx_todos_lane",
        "idx_todos_dedupe",
    }, reads


@pytest.mark.django_db(transaction=True)
def test_a_keyed_batch_is_planned_at_each_call_a_single_create_prepared() -> None:
    """A batch's turns are probed by a statement planned at its call, on the table as it is:
    a generic plan made while the table was nearly empty scanned it whole for every batch
    until the next ANALYZE (docs/benchmarks.md, scenario 15). Planning costs a batch little;
    a single create keeps its prepared plan, which planning at each call would slow by half
    (docs/queues.md, fairness)."""

    def prepared() -> set[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements")
            return {statement.split("\n", 1)[0] for (statement,) in cursor.fetchall()}

    def contract(name: str) -> str:
        return queries[name].split("\n", 1)[0]

    Todo.objects.create_many([{"kind": "k", "fair_key": "acme"}])
    Todo.objects.enqueue_many([{"kind": "k", "fair_key": "acme"}])
    assert not prepared() & {contract("create_many"), contract("fair_turns")}
    Todo.objects.create_todo(kind="k", fair_key="acme")
    assert contract("create_todo") in prepared()
