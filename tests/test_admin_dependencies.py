"""Dependencies in the admin: a todo's page shows its parents, its children and the graph
around it (inline SVG, every node a link); the list filters and shows blocked todos; Queue
health counts them apart from scheduled ones."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from switchboard_todos.admin.colours import COLOURS
from switchboard_todos.admin.graph import PER_LEVEL
from switchboard_todos.models import BLOCKED_UNTIL, State, Todo
from tests.helpers import MakeTodo, without_ids

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/switchboard_todos/todo/"
HEALTH = "/admin/switchboard_todos/todo/health/"


def change_url(todo_id: str) -> str:
    return f"{CHANGELIST}{quote(todo_id)}/change/"


def graph_of(page: str) -> str:
    found = re.search(r'<svg role="img" aria-label="The todos around.*?</svg>', page, re.S)
    assert found is not None
    return found[0]


def finish(todo: Todo, result: Any) -> None:
    Todo.objects.claim(todo.id, "w1", 30)
    Todo.objects.complete(todo.id, "w1", result)


@pytest.fixture
def line() -> dict[str, Todo]:
    """fetch -> (analyse, check) -> report -> publish -> archive; fetch and analyse done,
    check claimed, the rest blocked."""
    made = Todo.objects.create_many(
        [
            {"kind": "fetch", "ref": "fetch"},
            {"kind": "analyse", "ref": "analyse", "after": ["fetch"]},
            {"kind": "check", "ref": "check", "after": ["fetch"]},
            {"kind": "report", "ref": "report", "after": ["analyse", "check"]},
            {"kind": "publish", "ref": "publish", "after": ["report"]},
            {"kind": "archive", "ref": "archive", "after": ["publish"]},
        ]
    )
    todos = {todo.kind: todo for todo, _ in made}
    finish(todos["fetch"], {"rows": 3})
    finish(todos["analyse"], "3 rows look fine")
    Todo.objects.claim(todos["check"].id, "w2", 30)
    return {kind: Todo.objects.get(pk=todo.pk) for kind, todo in todos.items()}


def test_the_page_lists_parents_and_children_with_their_states(
    admin_client: Client, line: dict[str, Todo]
) -> None:
    page = admin_client.get(change_url(line["report"].id)).content.decode()
    assert "Dependencies" in page and "blocked: claimable once the todos it waits for" in page
    assert "blocked: waits for 1 todo" in page  # not "year 9999"
    assert "9999" not in without_ids(page)
    parents, children = re.findall(r'<table class="switchboard-relatives">.*?</table>', page, re.S)
    for kind, state, last in (("analyse", "done", "3 rows look fine"), ("check", "claimed", "")):
        row = re.search(rf'<tr><td><a href="[^"]+">{line[kind].id}</a></td>.*?</tr>', parents)
        assert row is not None and f"<td>{kind}</td><td>{state}</td><td>{last}</td>" in row[0]
    assert f'href="{change_url(line["analyse"].id)}"' in parents
    assert f'href="{change_url(line["publish"].id)}"' in children
    assert "<td>publish</td><td>blocked: waiting for other todos</td><td>1 todo</td>" in children


def test_the_graph_draws_two_levels_each_way_every_node_a_link(
    admin_client: Client, line: dict[str, Todo]
) -> None:
    svg = graph_of(admin_client.get(change_url(line["report"].id)).content.decode())
    links = re.findall(r'<a href="([^"]+)"><title>([^<]*)</title><rect[^>]*fill="([^"]+)"', svg)
    drawn = {url: (title, colour) for url, title, colour in links}
    assert set(drawn) == {change_url(line[kind].id) for kind in line}
    colours = {kind: drawn[change_url(todo.id)][1] for kind, todo in line.items()}
    assert colours["fetch"] == colours["analyse"] == "#5b9e3f"  # done
    assert colours["check"] == "#e0a800"  # claimed
    assert colours["report"] == colours["publish"] == colours["archive"] == "#8a8a8a"  # blocked
    assert "report (" in drawn[change_url(line["report"].id)][0]
    # fetch->analyse, fetch->check, analyse->report, check->report, report->publish,
    # publish->archive
    assert svg.count("<path d=") == 6 + 1  # and the arrowhead's
    assert 'stroke-width="3"' in svg  # the todo itself


def test_a_wide_graph_is_capped_and_says_how_many_more(
    admin_client: Client, make_todo: MakeTodo
) -> None:
    parts = [make_todo(state=State.CLAIMED, owner="w1", kind=f"part-{n}") for n in range(40)]
    merge, _ = Todo.objects.create_todo(kind="merge", after=[part.id for part in parts])
    page = admin_client.get(change_url(merge.id)).content.decode()
    svg = graph_of(page)
    assert svg.count("<rect") == PER_LEVEL + 1 and "and 33 more" in svg
    assert all(part.id in page for part in parts)  # the table lists them all


def test_the_page_costs_two_queries_for_the_graph(
    admin_client: Client, line: dict[str, Todo], make_todo: MakeTodo
) -> None:
    """One for a todo without parents or children (which finds it has no children: they are
    in todo_edges, not in its row); two for any graph (its relatives, then theirs), whatever
    their number."""
    counts = {}
    for name, todo in (("plain", make_todo()), ("graph", line["report"]), ("end", line["archive"])):
        with CaptureQueriesContext(connection) as queries:
            assert admin_client.get(change_url(todo.id)).status_code == 200
        counts[name] = len(queries)
    assert counts["graph"] == counts["end"] == counts["plain"] + 1, counts


# The list


def test_the_blocked_filter_shows_the_todos_waiting_for_others(
    admin_client: Client, line: dict[str, Todo], make_todo: MakeTodo
) -> None:
    retrying = make_todo(next_retry_in=timedelta(minutes=5))
    listed = admin_client.get(f"{CHANGELIST}?attention=blocked")
    shown = {todo.pk for todo in listed.context["cl"].result_list}
    assert shown == {line[kind].id for kind in ("report", "publish", "archive")}
    page = listed.content.decode()
    assert "blocked: waits for 1 todo" in page and "9999" not in without_ids(page)
    waiting = admin_client.get(f"{CHANGELIST}?attention=waiting").context["cl"].result_list
    assert [todo.pk for todo in waiting] == [retrying.pk]


def test_the_blocked_filter_costs_what_the_other_filters_do(
    admin_client: Client, line: dict[str, Todo]
) -> None:
    counts = []
    for attention in ("dead", "waiting", "blocked"):
        with CaptureQueriesContext(connection) as queries:
            admin_client.get(f"{CHANGELIST}?attention={attention}")
        counts.append(len(queries))
    assert counts[2] <= max(counts[:2]), counts


def test_the_blocked_filter_reads_the_scheduled_index(line: dict[str, Todo]) -> None:
    """Blocked todos wait at the end of idx_todos_scheduled: the filter reads that index."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(
            "EXPLAIN SELECT id FROM todos WHERE state = 'pending' AND next_retry_at = %s "
            "ORDER BY created_at DESC NULLS LAST LIMIT 100",
            [BLOCKED_UNTIL],
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "idx_todos_scheduled" in plan, plan


# Queue health


def test_queue_health_counts_blocked_todos_apart(
    admin_client: Client, line: dict[str, Todo]
) -> None:
    page = admin_client.get(HEALTH).content.decode()
    assert "default: 3 blocked" in page
    assert f'href="{CHANGELIST}?queue=default&amp;attention=blocked">3</a>' in page


# One colour per state


def legend_of(page: str) -> dict[str, str]:
    """A legend's label: colour."""
    swatch = r'<rect width="12" height="12" fill="([^"]+)"/></svg> ([^<]+)</span>'
    swatches = re.findall(swatch, page)
    return {label: colour for colour, label in swatches}


def test_each_state_has_one_colour_on_every_page(
    admin_client: Client, line: dict[str, Todo]
) -> None:
    """Claimed is amber on Queue health, in the graph and in the list; green is done alone."""
    health = legend_of(admin_client.get(HEALTH).content.decode())
    graph = legend_of(admin_client.get(change_url(line["report"].id)).content.decode())
    listed = admin_client.get(CHANGELIST).content.decode()
    assert health["claimed"] == graph["claimed"] == COLOURS["claimed"]
    assert health["blocked"] == graph["blocked: waiting for other todos"] == COLOURS["blocked"]
    assert health["dead letters"] == graph["failed (dead letter)"] == COLOURS["failed"]
    assert health["ready"] == graph["pending"] == COLOURS["ready"]
    assert graph["done"] == COLOURS["done"] not in health.values()
    assert len(set(COLOURS.values())) == len(COLOURS)
    check = re.search(rf"<tr>(?:(?!</tr>).)*{line['check'].id}.*?</tr>", listed, re.S)
    assert check is not None and f'fill="{COLOURS["claimed"]}"' in check[0]
