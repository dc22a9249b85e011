"""Claims narrowed with the ORM: any filter picks the candidates, never the claim's own rules."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import Q
from django.test.utils import CaptureQueriesContext

from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.models import State, Todo
from tests.conftest import run_in_threads
from tests.helpers import MakeTodo

pytestmark = pytest.mark.django_db


def test_a_filter_narrows_the_claim_in_one_statement() -> None:
    """Payload and kind filters pick the todos; priority then age order them; one query."""
    Todo.objects.create_many(
        [
            {"kind": "github.push", "payload": {"repo": "web"}},
            {"kind": "github.push", "payload": {"repo": "api"}},
            {"kind": "gitlab.push", "payload": {"repo": "api"}},
            {"kind": "github.issue", "payload": {"repo": "api"}, "priority": 10},
        ]
    )
    api = Todo.objects.filter(payload__repo="api", kind__startswith="github.")
    with CaptureQueriesContext(connection) as queries:
        first = api.claim_next("agent", 30)
    assert len(queries) == 1
    assert first is not None and (first.kind, first.state, first.owner, first.attempt) == (
        "github.issue",
        State.CLAIMED,
        "agent",
        1,
    )
    second = api.claim_next("agent", 30)
    assert second is not None and (second.kind, second.payload) == ("github.push", {"repo": "api"})
    assert api.claim_next("agent", 30) is None


def test_the_claim_s_own_conditions_cannot_be_filtered_away(make_todo: MakeTodo) -> None:
    """Only todos claimable by this owner are taken, whatever the filter lets through."""
    lapsed = make_todo(state=State.CLAIMED, lease_expires_in=timedelta(seconds=-5), title="lapsed")
    others: list[tuple[str, dict[str, Any]]] = [
        ("held", {"state": State.CLAIMED, "lease_expires_in": timedelta(minutes=5)}),
        ("done", {"state": State.DONE}),
        ("later", {"next_retry_in": timedelta(hours=1)}),
        ("theirs", {"assignee": "someone-else"}),
        (
            "spent",
            {"state": State.CLAIMED, "lease_expires_in": timedelta(seconds=-5), "attempt": 5},
        ),
    ]
    for title, values in others:
        make_todo(title=title, **values)
    mine = make_todo(assignee="agent", title="mine")
    everything = Todo.objects.filter(Q(state=State.DONE) | Q(title__isnull=False))
    claimed = everything.claim_batch("agent", 30, 10)
    assert sorted(todo.title for todo in claimed) == sorted([lapsed.title, mine.title])


def test_a_held_concurrency_key_keeps_its_other_todos_waiting() -> None:
    Todo.objects.create_many(
        [{"kind": "deploy", "concurrency_key": "repo:api", "payload": {"n": n}} for n in range(3)]
    )
    deploys = Todo.objects.filter(kind="deploy")
    [first] = deploys.claim_batch("a", 30, 3)
    assert first.payload == {"n": 0}
    assert deploys.claim_batch("b", 30, 3) == []
    Todo.objects.complete(first.id, "a")
    [second] = deploys.claim_batch("b", 30, 3)
    assert second.payload == {"n": 1}


def test_it_claims_inside_the_caller_s_transaction() -> None:
    Todo.objects.create_todo(kind="k")
    with transaction.atomic():
        assert Todo.objects.filter(kind="k").claim_next("a", 30) is not None
    assert Todo.objects.get().state == State.CLAIMED


@pytest.mark.parametrize(
    ("queryset", "why"),
    [
        (lambda: Todo.objects.all()[:5], "sliced"),
        (lambda: Todo.objects.filter(kind="a").union(Todo.objects.filter(kind="b")), "union"),
        (lambda: Todo.objects.values("id"), "returns values"),
        (lambda: Todo.objects.values_list("id", flat=True), "returns values"),
        (lambda: Todo.objects.distinct(), "distinct"),
    ],
)
def test_a_queryset_that_cannot_be_claimed_safely_says_why(queryset: object, why: str) -> None:
    with pytest.raises(InvalidTodo, match=f"This queryset cannot be claimed: .*{why}"):
        queryset().claim_next("a", 30)  # type: ignore[operator]


def test_bad_arguments_are_refused_before_anything_runs() -> None:
    with CaptureQueriesContext(connection) as queries, pytest.raises(InvalidTodo, match="ttl"):
        Todo.objects.filter(kind="k").claim_next("a", 0)
    assert len(queries) == 0


@pytest.mark.django_db(transaction=True)
def test_eight_concurrent_filtered_claimers_take_each_todo_once() -> None:
    """Real connections racing the same filter: SKIP LOCKED shares the todos out, none twice."""
    Todo.objects.create_many(
        [{"kind": "k", "payload": {"team": "a" if n % 2 else "b"}} for n in range(200)]
    )

    def drain(index: int) -> list[str]:
        taken: list[str] = []
        while batch := Todo.objects.filter(payload__team="a").claim_batch(f"w{index}", 30, 5):
            taken += [todo.id for todo in batch]
        return taken

    with CaptureQueriesContext(connection) as queries:
        Todo.objects.filter(payload__team="b").claim_next("outside-a-transaction", 30)
    # Django logs the BEGIN and COMMIT of the atomic block that compiles FOR UPDATE; psycopg
    # sends neither, as the block runs no statement.
    sent = [query["sql"] for query in queries if query["sql"] not in ("BEGIN", "COMMIT")]
    assert len(sent) == 1 and "FOR UPDATE OF" in sent[0] and "SKIP LOCKED" in sent[0]
    claimed = [todo_id for ids in run_in_threads(8, drain) for todo_id in ids]
    assert len(claimed) == len(set(claimed)) == 100
    claimed_teams = Todo.objects.filter(state=State.CLAIMED).values_list("payload__team")
    assert sorted(claimed_teams) == [("a",)] * 100 + [("b",)]
