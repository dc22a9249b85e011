"""The operator's admin, through Django's test client: pages, filters, actions, permissions."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import quote
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.models import QuerySet
from django.test import Client
from django.test.utils import CaptureQueriesContext

from switchboard_todos.admin import AdminTodoQuerySet, EstimatedCountPaginator, TodoAdmin
from switchboard_todos.admin.filters import active_filters
from switchboard_todos.models import BLOCKED_UNTIL, Event, State, Todo
from tests.helpers import MakeTodo, without_ids

CHANGELIST = "/admin/switchboard_todos/todo/"
HEALTH = "/admin/switchboard_todos/todo/health/"
REQUEUE_ALL = "/admin/switchboard_todos/todo/requeue-dead-letters/"
EVENTS = "/admin/switchboard_todos/event/"


def change_url(todo: Todo) -> str:
    return f"{CHANGELIST}{quote(todo.pk)}/change/"


def messages_of(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def run_action(client: Client, action: str, todos: list[Todo], **extra: str) -> Any:
    """Pick `todos` on the list and run `action`, as the action bar's Go button does."""
    data = {"action": action, "index": "0", "_selected_action": [t.pk for t in todos], **extra}
    return client.post(CHANGELIST, data, follow=True)


def bulk_todos(count: int, **fields: Any) -> list[Todo]:
    """Insert `count` todos in one statement (kind, queue, assignee and state vary)."""
    queues, kinds = ["mail", "billing", "default"], ["send", "charge", "sync", "index"]
    todos = [
        Todo(
            queue=queues[n % 3],
            kind=kinds[n % 4],
            title=f"todo {n}",
            assignee="bob" if n % 10 == 0 else None,
            **fields,
        )
        for n in range(count)
    ]
    return Todo.objects.bulk_create(todos)


# The list


def test_the_list_shows_the_columns_an_operator_needs(
    admin_client: Client, make_todo: MakeTodo
) -> None:
    """Ids, queue, kind, title, state, owner, attempts and the lease or retry time are listed."""
    claimed = make_todo(state=State.CLAIMED, owner="worker-7", title="Send the welcome mail")
    waiting = make_todo(
        next_retry_in=timedelta(minutes=5), attempt=2, errors=[{"attempt": 2, "error": {}}]
    )
    page = admin_client.get(CHANGELIST).content.decode()
    for text in [
        claimed.id,
        "worker-7",
        "Send the welcome mail",
        "1 of 5",
        "lease until",
        waiting.id,
        "retry at",
        "2 of 5",
        "Queue health",
    ]:
        assert text in page


def row_of(page: str, todo: Todo) -> str:
    """The list's row of `todo`."""
    found = re.search(rf"<tr>(?:(?!</tr>).)*{re.escape(todo.id)}.*?</tr>", page, re.S)
    assert found is not None, todo.id
    return found[0]


def test_a_pending_todo_says_what_holds_it_back(admin_client: Client, make_todo: MakeTodo) -> None:
    """ "retry at" only after a failed attempt; a todo given a time is scheduled, one whose time
    came (a parent just done, a backoff over) available, one waiting for others blocked."""
    failed = make_todo(next_retry_in=timedelta(minutes=5), attempt=1, errors=[{"attempt": 1}])
    scheduled = make_todo(next_retry_in=timedelta(hours=1))
    due = make_todo(next_retry_in=timedelta(seconds=-1))
    blocked = make_todo(next_retry_at=BLOCKED_UNTIL, waiting_for=2)
    ready = make_todo()
    page = admin_client.get(CHANGELIST).content.decode()
    assert "retry at" in row_of(page, failed)
    assert "scheduled for" in row_of(page, scheduled)
    assert "available since" in row_of(page, due)
    assert "blocked: waits for 2 todos" in row_of(page, blocked)
    assert "9999" not in without_ids(page)
    for todo in (scheduled, due, blocked, ready):
        assert "retry" not in row_of(page, todo)
    detail = admin_client.get(change_url(blocked)).content.decode()
    assert "next retry" not in detail.lower()
    assert re.search(r"Claimable:</label>\s*<div class=\"readonly\">blocked: waits for 2", detail)
    detail = admin_client.get(change_url(scheduled)).content.decode()
    assert re.search(r"Claimable:</label>\s*<div class=\"readonly\">scheduled for ", detail)


def test_a_todo_without_a_title_is_listed_by_its_kind(
    admin_client: Client, make_todo: MakeTodo
) -> None:
    """Not "-": a todo made before django.tasks todos got their task's name shows its kind."""
    untitled = make_todo(kind="billing.tasks.charge", title="")
    row = row_of(admin_client.get(CHANGELIST).content.decode(), untitled)
    assert "billing.tasks.charge" in row and ">-<" not in row


def test_a_lapsed_lease_is_marked_expired(admin_client: Client, make_todo: MakeTodo) -> None:
    """The list says "expired" by the database's clock for a lease that lapsed."""
    make_todo(state=State.CLAIMED, lease_expires_in=timedelta(seconds=-5))
    assert "<strong>expired</strong>" in admin_client.get(CHANGELIST).content.decode()


def test_a_page_costs_the_same_queries_whatever_the_rows(admin_client: Client) -> None:
    """No query per row, and a bounded number per page, every filter's choices included."""
    bulk_todos(110)
    with CaptureQueriesContext(connection) as fewer:
        admin_client.get(CHANGELIST)
    bulk_todos(290, state=State.DONE)
    with CaptureQueriesContext(connection) as more:
        response = admin_client.get(CHANGELIST)
    assert len(response.context["cl"].result_list) == 100
    assert len(more) == len(fewer) <= 12, [q["sql"] for q in more.captured_queries]


def test_the_list_never_counts_the_whole_table(admin_client: Client) -> None:
    """Every COUNT the list runs is capped by a LIMIT; none reads every row."""
    bulk_todos(30)
    with connection.cursor() as cursor:  # statistics another test or autovacuum left behind
        cursor.execute("ANALYZE todos")
    for query_string in ["", "?state__exact=pending", "?queue=mail", "?q=todo"]:
        with CaptureQueriesContext(connection) as queries:
            admin_client.get(CHANGELIST + query_string)
        counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
        assert counts, query_string
        assert all("LIMIT" in sql for sql in counts), counts


def test_a_large_table_is_counted_from_the_statistics(
    admin_client: Client, make_todo: MakeTodo
) -> None:
    """Past the exact limit the list shows PostgreSQL's estimate, marked as one."""
    bulk_todos(30)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE todos")
    EstimatedCountPaginator.exact_limit = 10
    try:
        page = admin_client.get(CHANGELIST).content.decode()
        filtered = admin_client.get(CHANGELIST + "?state__exact=pending")
    finally:
        EstimatedCountPaginator.exact_limit = 10_000
    assert "30 todos" in page and "PostgreSQL's estimate" in page
    assert filtered.context["cl"].paginator.count_is_estimate
    assert filtered.context["cl"].result_count >= 11


def test_the_list_offers_no_facet_counts(admin_client: Client, make_todo: MakeTodo) -> None:
    """Facets would count every filter choice over the table on each page view: they are off."""
    make_todo()
    assert "_facets" not in admin_client.get(CHANGELIST).content.decode()
    with CaptureQueriesContext(connection) as queries:
        admin_client.get(CHANGELIST + "?_facets=True")
    assert sum("COUNT(" in q["sql"].upper() for q in queries.captured_queries) <= 1


def test_the_list_leaves_out_the_json_columns(admin_client: Client, make_todo: MakeTodo) -> None:
    """Payload, result and failure history are not read for the list."""
    make_todo()
    with CaptureQueriesContext(connection) as queries:
        admin_client.get(CHANGELIST)
    listing = [
        q["sql"]
        for q in queries.captured_queries
        if "ORDER BY" in q["sql"] and "LIMIT 100" in q["sql"]
    ]
    assert listing and all('"payload"' not in sql and '"errors"' not in sql for sql in listing)


# Filters and search


@pytest.mark.parametrize(
    ("attention", "expected"),
    [("dead", "failed"), ("lease_expired", "lapsed"), ("waiting", "waiting"), ("ready", "ready")],
)
def test_the_attention_filter(
    admin_client: Client, make_todo: MakeTodo, attention: str, expected: str
) -> None:
    """Each situation shows exactly its todos."""
    todos = {
        "failed": make_todo(state=State.FAILED),
        "lapsed": make_todo(state=State.CLAIMED, lease_expires_in=timedelta(seconds=-1)),
        "claimed": make_todo(state=State.CLAIMED),
        "waiting": make_todo(next_retry_in=timedelta(minutes=1)),
        "ready": make_todo(),
        "due": make_todo(next_retry_in=timedelta(minutes=-1)),
        "done": make_todo(state=State.DONE),
    }
    shown = {
        t.pk
        for t in admin_client.get(f"{CHANGELIST}?attention={attention}").context["cl"].result_list
    }
    wanted = {todos[expected].pk} | ({todos["due"].pk} if attention == "ready" else set())
    assert shown == wanted


def test_queue_kind_and_assignee_filters(admin_client: Client) -> None:
    """The choices list what exists; each filter narrows the list to exact matches."""
    bulk_todos(20)
    response = admin_client.get(CHANGELIST)
    choices = {
        spec.parameter_name: [c[0] for c in spec.lookup_choices]
        for spec in response.context["cl"].filter_specs
        if hasattr(spec, "lookup_choices")
    }
    assert choices["queue"] == ["billing", "default", "mail"]
    assert choices["kind"] == ["charge", "index", "send", "sync"]
    assert choices["assignee"] == ["-", "bob"]

    def shown(query: str) -> QuerySet[Todo] | list[Todo]:
        return list(admin_client.get(CHANGELIST + query).context["cl"].result_list)

    assert {t.queue for t in shown("?queue=mail")} == {"mail"}
    assert {t.kind for t in shown("?kind=sync")} == {"sync"}
    assert {t.assignee for t in shown("?assignee=bob")} == {"bob"}
    assert {t.assignee for t in shown("?assignee=-")} == {None}


def test_the_fair_key_filter(admin_client: Client, make_todo: MakeTodo) -> None:
    """A key typed in lists its pending todos, with the list's other filters kept in the form;
    no key is read to offer choices."""
    wanted = [
        make_todo(queue="imports", fair_key="customer-7"),
        make_todo(queue="imports", fair_key="customer-7", priority=5),
        make_todo(queue="imports", fair_key="customer-7", next_retry_in=timedelta(minutes=5)),
    ]
    make_todo(queue="imports", fair_key="customer-7", state=State.DONE)
    make_todo(queue="mail", fair_key="customer-7")
    make_todo(queue="imports", fair_key="customer-8")
    make_todo(queue="imports")
    response = admin_client.get(CHANGELIST + "?queue=imports&fair_key=customer-7")
    assert {t.pk for t in response.context["cl"].result_list} == {t.pk for t in wanted}
    page = response.content.decode()
    assert '<input type="hidden" name="queue" value="imports">' in page
    assert '<input type="text" name="fair_key" value="customer-7"' in page
    assert active_filters(response.context["cl"]) == [
        "queue: imports",
        "fair key (pending todos): customer-7",
    ]
    everything = admin_client.get(CHANGELIST)
    assert '<input type="text" name="fair_key" value=""' in everything.content.decode()
    assert len(everything.context["cl"].result_list) == 7


def test_a_chosen_filter_value_stays_listed(admin_client: Client, make_todo: MakeTodo) -> None:
    """A queue chosen by URL stays among the choices even when nothing is in it."""
    response = admin_client.get(CHANGELIST + "?queue=nowhere")
    queue_filter = next(
        s
        for s in response.context["cl"].filter_specs
        if getattr(s, "parameter_name", "") == "queue"
    )
    assert ("nowhere", "nowhere") in queue_filter.lookup_choices


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ("id", {"target"}),
        ("delivery-42", {"target"}),
        ("agent-9", {"claimed"}),
        ("invoice", {"target", "titled"}),
        ("march invoice", {"titled"}),
    ],
)
def test_search(admin_client: Client, make_todo: MakeTodo, term: str, expected: set[str]) -> None:
    """Id, idempotency key and the owner of a claimed todo match exactly; other words, titles."""
    todos = {
        "target": make_todo(idempotency_key="delivery-42", title="invoice"),
        "claimed": make_todo(state=State.CLAIMED, owner="agent-9"),
        "done_by_owner": make_todo(state=State.DONE, owner="agent-9"),
        "titled": make_todo(title="The March invoice run"),
    }
    query = todos["target"].pk if term == "id" else term
    shown = {t.pk for t in admin_client.get(CHANGELIST, {"q": query}).context["cl"].result_list}
    assert shown == {todos[name].pk for name in expected}


def test_searching_an_id_reads_the_primary_key_only(
    admin_client: Client, make_todo: MakeTodo
) -> None:
    """An id search is one exact lookup: no LIKE over titles."""
    todo = make_todo()
    with CaptureQueriesContext(connection) as queries:
        admin_client.get(CHANGELIST, {"q": todo.pk})
    assert not any("LIKE" in q["sql"] for q in queries.captured_queries)


# The date hierarchy


@pytest.mark.parametrize("kind", ["year", "month", "day"])
def test_admin_datetimes_match_djangos(make_todo: MakeTodo, kind: Any) -> None:
    """The probing `datetimes` returns what Django's SELECT DISTINCT does."""
    for days in [0, 1, 3, 40, 400, 800]:
        make_todo(created_ago=timedelta(days=days, hours=1))
    ours = AdminTodoQuerySet(Todo).filter(kind="test.kind").datetimes("created_at", kind)
    theirs = Todo.objects.filter(kind="test.kind").datetimes("created_at", kind)
    assert list(ours) == list(theirs)
    assert list(AdminTodoQuerySet(Todo).filter(kind="none").datetimes("created_at", kind)) == []
    assert list(AdminTodoQuerySet(Todo).datetimes("created_at", "hour")) == list(
        Todo.objects.datetimes("created_at", "hour")
    )


def test_the_date_hierarchy_links_days_that_have_todos(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within one month the hierarchy lists the days with todos, and drilling down filters."""
    monkeypatch.setattr(TodoAdmin, "list_per_page", 2)
    Todo.objects.bulk_create(
        [Todo(kind="k", created_at=datetime(2025, 3, day, 12, tzinfo=UTC)) for day in (2, 2, 9)]
    )
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(CHANGELIST).content.decode()
    assert sum('MIN("todos"."created_at")' in q["sql"] for q in queries.captured_queries) == 1
    assert "created_at__day=2" in page and "created_at__day=9" in page
    assert "created_at__day=3" not in page
    day = admin_client.get(
        CHANGELIST + "?created_at__year=2025&created_at__month=3&created_at__day=2"
    )
    assert len(day.context["cl"].result_list) == 2
    assert "All dates" not in page and "March 2025" in day.content.decode()


def test_one_page_of_results_needs_no_date_hierarchy(
    admin_client: Client, make_todo: MakeTodo
) -> None:
    """When everything fits on one page the hierarchy is left out, and so are its queries."""
    make_todo()
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(CHANGELIST).content.decode()
    assert "created_at__year" not in page
    assert not any("MIN(" in q["sql"] for q in queries.captured_queries)


# The detail page


def test_the_detail_page_explains_the_todo(admin_client: Client, make_todo: MakeTodo) -> None:
    """Payload and result as indented JSON, the event linked, the failures as a table."""
    event = Event.objects.create(source="github", kind="push", delivery_id="d-1")
    todo = make_todo(
        state=State.FAILED,
        event=event,
        payload={"order": 7, "items": ["a"]},
        result={"type": "ValueError", "message": "bad total"},
        errors=[
            {
                "attempt": 1,
                "owner": "w1",
                "claimed_at": "2025-01-01T10:00:00+00:00",
                "at": "2025-01-01T10:00:05+00:00",
                "error": {
                    "type": "ValueError",
                    "message": "bad total",
                    "traceback": "Traceback (most recent call last)",
                    "code": 17,
                },
            },
            {
                "attempt": 2,
                "owner": "w2",
                "at": "2025-01-01T10:01:00+00:00",
                "error": {"type": "LeaseExpired", "message": "The lease lapsed"},
            },
        ],
    )
    page = admin_client.get(change_url(todo)).content.decode()
    assert "{\n  &quot;items&quot;: [\n    &quot;a&quot;\n  ],\n  &quot;order&quot;: 7\n}" in page
    assert f'href="/admin/switchboard_todos/event/{quote(event.pk)}/change/"' in page
    for text in [
        "switchboard-failures",
        "ValueError",
        "bad total",
        "Traceback (most recent call last)",
        "&quot;code&quot;: 17",
        "LeaseExpired",
        "w2",
        "dead letter",
    ]:
        assert text in page
    assert 'name="_save"' not in page


def test_the_detail_page_shows_the_fair_key_and_turn(
    admin_client: Client, make_todo: MakeTodo
) -> None:
    """A todo's tenant and its turn, the order of claims within its priority."""
    todo = make_todo(fair_key="agent:bot/7")
    Todo.objects.filter(pk=todo.pk).update(fair_at=datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC))
    page = admin_client.get(change_url(todo)).content.decode()
    assert "agent:bot/7" in page
    assert "Fair key:" in page and "Turn:" in page
    assert "March 4, 2026, 5:06 a.m." in page


def test_ids_that_look_like_admin_escapes_still_link(
    admin_client: Client, make_todo: MakeTodo
) -> None:
    """The admin escapes "_" in URLs; an id like td_40… (which "_40", "@", would mangle) works."""
    event = Event.objects.create(id="ev_40000000-0000-4000-8000-000000000000", source="s", kind="k")
    todo = make_todo(id="td_40000000-0000-4000-8000-000000000000", event=event)
    page = admin_client.get(change_url(todo))
    assert page.status_code == 200
    link = f"/admin/switchboard_todos/event/{quote(event.pk)}/change/"
    assert f'href="{link}"' in page.content.decode()
    assert admin_client.get(link).status_code == 200


def test_the_detail_page_costs_a_fixed_number_of_queries(
    admin_client: Client, make_todo: MakeTodo
) -> None:
    """The queries do not depend on the failure history's length or the event."""
    event = Event.objects.create(source="s", kind="k")
    plain = make_todo(errors=[{"attempt": 1, "owner": "w", "error": {"type": "E"}}])
    busy = make_todo(
        state=State.FAILED,
        event=event,
        errors=[
            {"attempt": n, "owner": "w", "at": None, "error": {"type": "E", "message": "m"}}
            for n in range(30)
        ],
    )
    counts = []
    for todo in (plain, busy):
        with CaptureQueriesContext(connection) as queries:
            assert admin_client.get(change_url(todo)).status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1] <= 6, counts


def test_a_todo_cannot_be_added_edited_or_deleted(
    admin_client: Client, make_todo: MakeTodo
) -> None:
    """The admin is read-only; changes go through actions."""
    todo = make_todo()
    assert admin_client.get(f"{CHANGELIST}add/").status_code == 403
    assert admin_client.post(change_url(todo), {"state": "done"}).status_code == 403
    assert admin_client.get(f"{CHANGELIST}{quote(todo.pk)}/delete/").status_code == 403
    actions = dict(admin_client.get(CHANGELIST).context["action_form"].fields["action"].choices)
    assert "delete_selected" not in actions


@pytest.mark.parametrize(
    ("state", "action", "codename"),
    [
        (State.FAILED, "requeue_selected", "requeue_todo"),
        (State.CLAIMED, "expire_lease_selected", "expire_lease_todo"),
        (State.PENDING, "cancel_selected", "cancel_todo"),
        (State.CLAIMED, "cancel_selected", "cancel_todo"),
        (State.PENDING, "set_priority_selected", "set_priority_todo"),
    ],
)
def test_the_detail_page_offers_the_repair_its_state_allows(
    operator: Callable[..., Client], make_todo: MakeTodo, state: str, action: str, codename: str
) -> None:
    """A button for each action that fits the state, shown only with its permission."""
    todo = make_todo(state=state)
    others = {other for other, (_, needs) in ACTIONS.items() if state not in needs}
    page = operator("view_todo", *[code for code, _ in ACTIONS.values()]).get(change_url(todo))
    assert page.status_code == 200, (page.status_code, page.get("Location"))
    html = page.content.decode()
    assert f'value="{action}"' in html and not any(f'value="{o}"' in html for o in others)
    assert f'value="{action}"' not in operator("view_todo").get(change_url(todo)).content.decode()


def test_a_dead_letters_page_points_at_its_requeue_button(
    operator: Callable[..., Client], make_todo: MakeTodo
) -> None:
    """Not "from the list": the button is on the page, and the page says so."""
    todo = make_todo(state=State.FAILED)
    html = operator("view_todo", "requeue_todo").get(change_url(todo)).content.decode()
    assert "from the list" not in html
    assert "the button “Requeue this dead letter” at the top of this page" in html
    assert 'value="Requeue this dead letter"' in html


def test_the_requeue_button_requeues_and_shows_the_todo(
    admin_client: Client, make_todo: MakeTodo
) -> None:
    """The button posts the action for this todo; the list then shows just it, requeued."""
    todo = make_todo(state=State.FAILED)
    response = admin_client.post(
        f"{CHANGELIST}?q={todo.pk}",
        {"action": "requeue_selected", "index": "0", "_selected_action": [todo.pk]},
        follow=True,
    )
    assert messages_of(response) == ["1 todo requeued."]
    assert [t.state for t in response.context["cl"].result_list] == [State.PENDING]


# Actions


def test_requeue_selected(admin_client: Client, make_todo: MakeTodo) -> None:
    """Dead letters go back to pending; one LogEntry each; counts and refusals in messages."""
    dead = [make_todo(state=State.FAILED) for _ in range(2)]
    twin = make_todo(state=State.FAILED, idempotency_key="k1")
    live = make_todo(idempotency_key="k1")
    response = run_action(admin_client, "requeue_selected", [*dead, twin, live])
    assert messages_of(response) == [
        "2 todos requeued.",
        f"1 not requeued: a live todo holds the same idempotency key ({twin.pk}).",
        f"1 not requeued: it is pending, not dead-lettered ({live.pk}).",
    ]
    assert {Todo.objects.get(pk=t.pk).state for t in dead} == {State.PENDING}
    entries = LogEntry.objects.filter(action_flag=CHANGE)
    assert sorted(str(e.object_id) for e in entries) == sorted(t.pk for t in dead)
    assert {e.user.username for e in entries} == {"admin"}
    assert {e.get_change_message() for e in entries} == {
        "Requeued: dead letter back to pending, attempts reset."
    }


def test_expire_lease_selected(admin_client: Client, make_todo: MakeTodo) -> None:
    """Claimed todos' leases lapse now, logged with the holder; others are refused."""
    claimed = make_todo(state=State.CLAIMED, owner="w9", attempt=2)
    pending = make_todo()
    response = run_action(admin_client, "expire_lease_selected", [claimed, pending])
    assert messages_of(response) == [
        "1 todo expired.",
        f"1 not expired: it is pending, not claimed ({pending.pk}).",
    ]
    assert Todo.objects.filter(
        pk=claimed.pk, lease_expires_at__lte=Todo.objects.get(pk=claimed.pk).updated_at
    ).exists()
    entry = LogEntry.objects.get()
    assert entry.change_message == "Expired the lease held by w9 (attempt 2 of 5)."


def test_cancel_asks_for_a_reason_first(admin_client: Client, make_todo: MakeTodo) -> None:
    """The first step is a confirmation page with a reason field; nothing changes yet."""
    pending, claimed = make_todo(title="Resend invoice"), make_todo(state=State.CLAIMED)
    done = make_todo(state=State.DONE)
    response = run_action(admin_client, "cancel_selected", [pending, claimed, done])
    page = response.content.decode()
    assert "<strong>2</strong> pending or claimed todos will be cancelled" in page
    assert "Resend invoice" in page and 'name="reason"' in page
    assert "stops at its next heartbeat" in page
    assert "1 selected todos are neither pending nor claimed" in page
    assert Todo.objects.get(pk=pending.pk).state == State.PENDING
    empty = admin_client.post(
        CHANGELIST,
        {
            "action": "cancel_selected",
            "post": "yes",
            "_selected_action": [pending.pk],
            "reason": " ",
        },
    )
    assert "This field is required" in empty.content.decode()
    assert Todo.objects.get(pk=pending.pk).state == State.PENDING


def test_set_priority_asks_then_sets_it_on_pending_todos(
    admin_client: Client, make_todo: MakeTodo
) -> None:
    """The form asks for a priority in range; pending todos get it, each change audited."""
    pending, claimed = make_todo(title="Urgent report"), make_todo(state=State.CLAIMED)
    page = run_action(admin_client, "set_priority_selected", [pending, claimed]).content.decode()
    assert "get the priority below" in page and "Urgent report" in page
    assert 'name="priority"' in page and "1 selected todos are not pending" in page
    too_high = run_action(
        admin_client, "set_priority_selected", [pending], post="yes", priority="101"
    )
    assert "less than or equal to 100" in too_high.content.decode()
    assert Todo.objects.get(pk=pending.pk).priority == 0
    response = run_action(
        admin_client, "set_priority_selected", [pending, claimed], post="yes", priority="42"
    )
    assert messages_of(response) == [
        "1 todo reprioritised.",
        f"1 not reprioritised: it is claimed, not pending ({claimed.pk}).",
    ]
    assert Todo.objects.get(pk=pending.pk).priority == 42
    assert LogEntry.objects.get().change_message == "Priority set to 42 while pending."


def test_the_priority_filter(admin_client: Client, make_todo: MakeTodo) -> None:
    high, normal, low = make_todo(priority=5), make_todo(), make_todo(priority=-5)
    for choice, todo in (("high", high), ("normal", normal), ("low", low)):
        listed = admin_client.get(f"{CHANGELIST}?priority={choice}").context["cl"].result_list
        assert [shown.pk for shown in listed] == [todo.pk]


def test_cancel_with_a_reason(admin_client: Client, make_todo: MakeTodo) -> None:
    """Confirmed with a reason, pending and claimed todos become dead letters carrying it, each
    change audited with whom it was taken from."""
    pending, claimed = make_todo(), make_todo(state=State.CLAIMED, owner="w7", attempt=2)
    done = make_todo(state=State.DONE)
    response = admin_client.post(
        CHANGELIST,
        {
            "action": "cancel_selected",
            "post": "yes",
            "reason": "customer left",
            "_selected_action": [pending.pk, claimed.pk, done.pk],
        },
        follow=True,
    )
    assert messages_of(response) == [
        "2 todos cancelled.",
        f"1 not cancelled: it is done, neither pending nor claimed ({done.pk}).",
    ]
    for todo in (pending, claimed):
        dead = Todo.objects.get(pk=todo.pk)
        assert (dead.state, dead.result) == (
            State.FAILED,
            {"type": "Cancelled", "message": "customer left"},
        )
    assert sorted(LogEntry.objects.values_list("change_message", flat=True)) == [
        "Cancelled while claimed by w7 (attempt 2 of 5): customer left",
        "Cancelled while pending: customer left",
    ]


def test_the_cancel_button_of_a_running_todo(admin_client: Client, make_todo: MakeTodo) -> None:
    """A claimed todo's page offers Cancel…, which asks for the reason of this one todo."""
    todo = make_todo(state=State.CLAIMED)
    page = admin_client.get(change_url(todo)).content.decode()
    assert 'value="cancel_selected"' in page and 'value="Cancel…"' in page
    confirm = admin_client.post(
        f"{CHANGELIST}?q={todo.pk}",
        {"action": "cancel_selected", "index": "0", "_selected_action": [todo.pk]},
    ).content.decode()
    assert "<strong>1</strong> pending or claimed todos will be cancelled" in confirm
    assert Todo.objects.get(pk=todo.pk).state == State.CLAIMED


def test_the_progress_note_on_the_list_and_the_page(
    admin_client: Client, make_todo: MakeTodo
) -> None:
    """The list shows the head of each note, cut in the database; the page shows it whole."""
    todo = make_todo(state=State.CLAIMED, owner="w1")
    Todo.objects.heartbeat(todo.id, "w1", 30, progress="page " + "9" * 100)
    other = make_todo(state=State.CLAIMED, owner="w1")
    Todo.objects.heartbeat(other.id, "w1", 30, progress={"files": 3})
    listed = admin_client.get(CHANGELIST)
    notes = {t.pk: t.progress_head for t in listed.context["cl"].result_list}
    assert notes[todo.pk] == "page " + "9" * 56 and notes[other.pk] == '{"files": 3}'
    html = listed.content.decode()
    assert "page " + "9" * 54 + "…" in html and "{&quot;files&quot;: 3}" in html
    page = admin_client.get(change_url(todo)).content.decode()
    assert "progress note" in page and "9" * 100 in page


def test_select_all_walks_only_the_todos_the_action_applies_to(admin_client: Client) -> None:
    """With "select all" over a filter, every matching dead letter is requeued, in batches."""
    bulk_todos(7, state=State.FAILED)
    bulk_todos(3, state=State.DONE)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TodoAdmin, "action_batch_size", 2)
        response = admin_client.post(
            CHANGELIST + "?queue=mail",
            {
                "action": "requeue_selected",
                "index": "0",
                "select_across": "1",
                "_selected_action": [Todo.objects.filter(queue="mail")[0].pk],
            },
            follow=True,
        )
    assert messages_of(response) == ["3 todos requeued."]
    assert Todo.objects.filter(state=State.PENDING).count() == 3
    assert set(Todo.objects.filter(state=State.PENDING).values_list("queue", flat=True)) == {"mail"}
    assert LogEntry.objects.count() == 3


def test_an_action_that_matches_nothing_says_so(admin_client: Client, make_todo: MakeTodo) -> None:
    """ "Select all" over a filter without dead letters changes nothing and says why."""
    todo = make_todo()
    response = run_action(admin_client, "requeue_selected", [todo], select_across="1")
    assert messages_of(response) == ["No todos requeued: none matched."]


def test_many_refusals_name_a_few_ids_and_count_the_rest(
    admin_client: Client, make_todo: MakeTodo
) -> None:
    """A refusal message lists five ids, then how many more."""
    pending = [make_todo() for _ in range(7)]
    (message,) = messages_of(run_action(admin_client, "requeue_selected", pending))
    assert message.startswith("7 not requeued: it is pending, not dead-lettered (td_")
    assert message.endswith(" and 2 more).") and message.count("td_") == 5


def test_a_long_action_stops_at_its_time_limit(admin_client: Client, make_todo: MakeTodo) -> None:
    """Past the time limit no new batch starts, and the message says todos are left."""
    dead = [make_todo(state=State.FAILED) for _ in range(5)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TodoAdmin, "action_batch_size", 2)
        patch.setattr(TodoAdmin, "action_time_limit", 0.0)
        response = run_action(admin_client, "requeue_selected", dead)
    assert messages_of(response)[0] == "2 todos requeued."
    assert "Stopped after 0 seconds with todos left" in messages_of(response)[1]
    assert Todo.objects.filter(state=State.PENDING).count() == 2


#: Each action: its permission, and the states of the todos it applies to.
ACTIONS = {
    "requeue_selected": ("requeue_todo", (State.FAILED,)),
    "expire_lease_selected": ("expire_lease_todo", (State.CLAIMED,)),
    "cancel_selected": ("cancel_todo", (State.PENDING, State.CLAIMED)),
    "set_priority_selected": ("set_priority_todo", (State.PENDING,)),
}


@pytest.mark.parametrize("action", ACTIONS)
def test_each_action_needs_its_permission(
    operator: Callable[..., Client], make_todo: MakeTodo, action: str
) -> None:
    """A staff user who may only view sees no action and cannot run one; the permission adds it."""
    codename, states = ACTIONS[action]
    todo = make_todo(state=states[0])
    viewer = operator("view_todo")
    assert viewer.get(CHANGELIST).context["action_form"] is None
    response = run_action(viewer, action, [todo], post="yes", reason="r", priority="9")
    assert messages_of(response) == []

    def fingerprint() -> tuple[Any, ...]:
        fresh = Todo.objects.get(pk=todo.pk)
        return fresh.state, fresh.lease_expires_at, fresh.priority

    before = fingerprint()
    assert not LogEntry.objects.exists()
    allowed = operator("view_todo", codename)
    choices = dict(allowed.get(CHANGELIST).context["action_form"].fields["action"].choices)
    assert set(choices) - {""} == {action}
    run_action(allowed, action, [todo], post="yes", reason="r", priority="9")
    assert fingerprint() != before
    assert LogEntry.objects.count() == 1


# Requeue every dead letter matching the filter


def test_requeue_all_confirms_then_requeues_every_match(admin_client: Client) -> None:
    """The link carries the filter; the page counts the matches; the POST requeues them all."""
    bulk_todos(9, state=State.FAILED)
    list_page = admin_client.get(CHANGELIST + "?queue=billing").content.decode()
    assert f'href="{REQUEUE_ALL}?queue=billing"' in list_page
    confirm = admin_client.get(REQUEUE_ALL + "?queue=billing").content.decode()
    assert "<strong>3</strong> dead letters" in confirm and "queue: billing" in confirm
    narrowed = admin_client.get(
        REQUEUE_ALL + "?queue=billing&q=todo&created_at__year=2020&attention=dead"
    ).content.decode()
    for line in ["queue: billing", "search: todo", "year: 2020", "needs attention: Dead-lettered"]:
        assert f"<li>{line}</li>" in narrowed
    assert "<strong>0</strong> dead letters" in narrowed
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TodoAdmin, "action_batch_size", 2)
        response = admin_client.post(REQUEUE_ALL + "?queue=billing", follow=True)
    assert response.redirect_chain[-1][0] == f"{CHANGELIST}?queue=billing"
    assert messages_of(response) == ["3 todos requeued."]
    assert set(Todo.objects.filter(state=State.PENDING).values_list("queue", flat=True)) == {
        "billing"
    }
    assert LogEntry.objects.count() == 3


def test_requeue_all_without_a_filter_says_so(admin_client: Client, make_todo: MakeTodo) -> None:
    """With no filter the page warns that this is every dead letter in every queue."""
    make_todo(state=State.FAILED)
    assert "every dead letter in every queue" in admin_client.get(REQUEUE_ALL).content.decode()


def test_requeue_all_needs_the_requeue_permission(
    operator: Callable[..., Client], make_todo: MakeTodo
) -> None:
    """Without requeue_todo the link is hidden and the page refuses."""
    make_todo(state=State.FAILED)
    viewer = operator("view_todo")
    assert REQUEUE_ALL not in viewer.get(CHANGELIST).content.decode()
    assert viewer.get(REQUEUE_ALL).status_code == 403
    assert viewer.post(REQUEUE_ALL).status_code == 403
    assert Todo.objects.get().state == State.FAILED


def test_requeue_all_needs_the_view_permission_too(
    operator: Callable[..., Client], make_todo: MakeTodo
) -> None:
    """requeue_todo alone does not open the page: the list it acts on is not the user's to see."""
    make_todo(state=State.FAILED)
    blind = operator("requeue_todo")
    assert blind.get(REQUEUE_ALL).status_code == 403
    assert blind.post(REQUEUE_ALL).status_code == 403
    assert Todo.objects.get().state == State.FAILED
    assert operator("view_todo", "requeue_todo").post(REQUEUE_ALL).status_code == 302
    assert Todo.objects.get().state == State.PENDING


# NUL (0x00): PostgreSQL text cannot hold it, so no todo or event has one


@pytest.mark.parametrize(
    "url",
    [
        CHANGELIST + "?queue=%00",
        CHANGELIST + "?kind=a%00b",
        CHANGELIST + "?assignee=%00",
        CHANGELIST + "?state__exact=%00",
        CHANGELIST + "?q=%00",
        CHANGELIST + "?q=td_%00",
        CHANGELIST + "?%00=1",
        REQUEUE_ALL + "?queue=%00",
        EVENTS + "?q=%00",
    ],
)
def test_a_nul_in_a_filter_or_a_search_is_a_bad_request(
    admin_client: Client, make_todo: MakeTodo, url: str
) -> None:
    make_todo()
    assert admin_client.get(url).status_code == 400


def test_a_nul_in_an_action_is_a_bad_request(admin_client: Client, make_todo: MakeTodo) -> None:
    todo = make_todo(state=State.FAILED)
    data = {"action": "requeue_selected", "index": "0", "_selected_action": [todo.pk, "td_\x00"]}
    assert admin_client.post(CHANGELIST, data).status_code == 400
    assert Todo.objects.get().state == State.FAILED


@pytest.mark.parametrize("page", ["change", "history", "delete"])
@pytest.mark.parametrize("model", ["todo", "event"])
def test_a_nul_in_an_id_is_not_found(admin_client: Client, page: str, model: str) -> None:
    assert admin_client.get(f"/admin/switchboard_todos/{model}/td_%00x/{page}/").status_code == 404


# Queue health


def test_the_health_page(admin_client: Client, make_todo: MakeTodo) -> None:
    """Numbers per queue, a bar per queue, and links into the filtered list.

    The page and the factory read the same clock, the transaction's: the ages are exact however
    long after the transaction's start (here 0.6 s) the todos are made.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(0.6)")
    make_todo(queue="mail", created_ago=timedelta(minutes=3, seconds=30))
    make_todo(queue="mail", state=State.FAILED)
    make_todo(queue="billing", state=State.CLAIMED, lease_expires_in=timedelta(seconds=-0.5))
    page = admin_client.get(HEALTH).content.decode()
    assert "<svg" in page and "mail: 1 ready" in page and "billing: 1 lease expired" in page
    assert "3 min 30 s" in page
    assert f'href="{CHANGELIST}?queue=mail&amp;attention=dead"' in page


def test_the_health_page_shows_the_tenants(admin_client: Client, make_todo: MakeTodo) -> None:
    """Per queue with fair keys waiting: how many, their todos, those without a key, and the
    top keys by depth and by age, each linked to its pending todos."""
    for ago in (10, 5, 1):
        make_todo(queue="imports", fair_key="big", created_ago=timedelta(minutes=ago))
    make_todo(queue="imports", fair_key="old", created_ago=timedelta(hours=2))
    make_todo(queue="imports")
    make_todo(queue="mail")
    response = admin_client.get(HEALTH)
    [(imports, unkeyed)] = response.context["tenants"]
    assert (imports.queue, imports.keys, imports.keyed, unkeyed) == ("imports", 2, 4, 1)
    page = response.content.decode()
    assert 'id="tenants"' in page
    link = f'<a href="{CHANGELIST}?queue=imports&amp;fair_key=big">big</a>'
    assert f"{link} 3" in page and f"{link} 10 min 0 s" in page
    assert f'<a href="{CHANGELIST}?queue=imports&amp;fair_key=old">old</a> 2 h 0 min' in page


def test_the_health_page_without_fair_keys_shows_no_tenants(
    admin_client: Client, make_todo: MakeTodo
) -> None:
    make_todo(queue="mail")
    assert 'id="tenants"' not in admin_client.get(HEALTH).content.decode()


def test_the_health_page_is_linked_and_gated(operator: Callable[..., Client], db: None) -> None:
    """Linked from the app index; needs the view permission."""
    viewer = operator("view_todo")
    assert HEALTH in viewer.get("/admin/switchboard_todos/").content.decode()
    assert viewer.get(HEALTH).status_code == 200
    assert operator().get(HEALTH).status_code == 403


def test_the_health_page_lists_the_repairs_the_user_may_make(
    operator: Callable[..., Client], make_todo: MakeTodo
) -> None:
    """Each repair the user holds the permission of, linked to the todos it applies to."""
    make_todo()
    page = operator("view_todo", "requeue_todo").get(HEALTH).content.decode()
    link = f'<a href="{CHANGELIST}?state__exact=failed">Failed (dead letter)</a>'
    assert f"{link}: Requeue this dead letter (Back to pending" in page
    assert "Expire its lease now" not in page and "Cancel…" not in page
    assert "Repairs you may make" not in operator("view_todo").get(HEALTH).content.decode()


def test_the_health_page_with_no_todos(admin_client: Client) -> None:
    """An empty table is said in words, not drawn."""
    assert "No todos yet." in admin_client.get(HEALTH).content.decode()


# Events


@pytest.fixture
def event_with(make_todo: MakeTodo) -> Iterator[Callable[[int], Event]]:
    def make(count: int) -> Event:
        event = Event.objects.create(source="github", kind="push", delivery_id=f"d-{count}")
        for _ in range(count):
            make_todo(event=event)
        return event

    yield make


def test_the_event_page_lists_its_todos(
    admin_client: Client, event_with: Callable[[int], Event]
) -> None:
    """The event's todos are inline, read-only, and cost one query whatever their number."""
    counts = []
    for size in (1, 12):
        event = event_with(size)
        ContentType.objects.clear_cache()
        with CaptureQueriesContext(connection) as queries:
            page = admin_client.get(f"{EVENTS}{quote(event.pk)}/change/").content.decode()
        counts.append(len(queries))
        assert page.count("/admin/switchboard_todos/todo/td_") == size
    assert counts[0] == counts[1]
    assert 'name="_save"' not in page


def test_events_are_searched_by_id_or_delivery(admin_client: Client, db: None) -> None:
    """Exact event id or delivery id."""
    event = Event.objects.create(source="s", kind="k", delivery_id="abc")
    Event.objects.create(source="s", kind="k", delivery_id="other")
    for term in (event.pk, "abc"):
        shown = admin_client.get(EVENTS, {"q": term}).context["cl"].result_list
        assert [e.pk for e in shown] == [event.pk]
    assert admin_client.get(f"{EVENTS}add/").status_code == 403
