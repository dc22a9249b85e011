"""The SQL file itself: every statement loads and parses, and the hot paths use their indexes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

import switchboard_todos
from switchboard_todos import validation
from switchboard_todos.claims.marks import FROM_HEAD, MARK_SLACK, Marks
from switchboard_todos.managers import claiming
from switchboard_todos.managers.machinery import with_history
from switchboard_todos.models import State, Todo
from switchboard_todos.sql import SOURCE, parse, queries, written
from switchboard_todos.transitions import DEFAULT_MAX_ATTEMPTS, TRANSITIONS

PARAM = re.compile(r"%\((\w+)\)s")


def test_every_statement_is_loaded_and_used() -> None:
    """Each transition has its named statement, and no statement or fragment is dead code."""
    assert set(queries) >= set(TRANSITIONS) | {"classify_miss"}
    package = Path(switchboard_todos.__file__).parent
    source = "\n".join(path.read_text() for path in package.rglob("*.py"))
    for name in queries:
        assert f'"{name}"' in source, f"statement {name} is never run"
    statements, fragments = written(SOURCE)
    text = "\n".join([*statements.values(), *(fragment.body for fragment in fragments.values())])
    for name in fragments:
        assert re.search(r"\{\{" + name + r"\b", text), f"fragment {name} is never used"


def test_parse_refuses_a_name_given_twice() -> None:
    """Two blocks with one name would silently shadow each other."""
    with pytest.raises(ValueError, match="'x' is defined twice"):
        parse("-- name: x\nSELECT 1;\n-- name: x\nSELECT 2;\n")
    with pytest.raises(ValueError, match="'x' is defined twice"):
        parse("-- fragment: x\n1\n-- name: x\nSELECT 2;\n")


def test_fragments_are_composed_in_place() -> None:
    """Values fill the parameters, fragments nest, and each line keeps its indentation."""
    text = """
-- fragment: entry(who, error)
-- Documentation, not copied.
jsonb_build_object(
    'who', $who,
    'error', $error, 'whom', $who)
-- fragment: lapsed
jsonb_build_object('type', 'LeaseExpired',
    'message', 'lapsed, it did')
-- name: x
-- The contract line stays.
SELECT {{entry(owner, {{lapsed}})}},
       {{entry(f(a, 'b,c'), NULL)}};
"""
    assert parse(text) == {
        "x": """-- The contract line stays.
SELECT jsonb_build_object(
    'who', owner,
    'error', jsonb_build_object('type', 'LeaseExpired',
        'message', 'lapsed, it did'), 'whom', owner),
       jsonb_build_object(
           'who', f(a, 'b,c'),
           'error', NULL, 'whom', f(a, 'b,c'))"""
    }


def test_one_block_may_be_the_statement_of_twins() -> None:
    """`-- name: x(a=1), y(a=2)` is two statements, each with its constants in place of `$a`,
    its fragments composed from those; a constant the text never uses is an error."""
    text = """
-- fragment: capped(cap)
LIMIT $cap
-- name: x(cap=1000), x_few(cap=100)
-- The contract line, under $cap.
SELECT 1 {{capped($cap)}};
"""
    assert parse(text) == {
        "x": "-- The contract line, under 1000.\nSELECT 1 LIMIT 1000",
        "x_few": "-- The contract line, under 100.\nSELECT 1 LIMIT 100",
    }
    with pytest.raises(ValueError, match="'y': 'other=1' is not a value its text uses"):
        parse("-- name: y(other=1)\nSELECT 1;\n")
    with pytest.raises(ValueError, match="'x' is defined twice"):
        parse("-- name: x(a=1), x(a=2)\nSELECT $a;\n")
    with pytest.raises(ValueError, match="one name, and its parameters' names"):
        parse("-- fragment: f(a=1)\n$a\n-- name: x\nSELECT {{f(1)}};\n")


@pytest.mark.parametrize(
    ("statement", "error"),
    [
        ("SELECT {{nowhere}}", "Unknown SQL fragment 'nowhere'"),
        ("SELECT {{one}}", "'one' takes \\('value',\\), given \\[\\]"),
        ("SELECT {{one(1, 2)}}", "takes"),
        ("SELECT {{one(1", "Unclosed"),
        ("SELECT {{one(1,\n 2)}}", "one line"),
        ("SELECT {{itself}}", "nest too deep"),
    ],
)
def test_parse_refuses_a_bad_fragment_reference(statement: str, error: str) -> None:
    """A reference that cannot be composed fails at load, never at the database."""
    fragments = "-- fragment: one(value)\n$value\n-- fragment: itself\n{{itself}}\n"
    with pytest.raises(ValueError, match=error):
        parse(f"{fragments}-- name: x\n{statement}\n")


#: A CTE's definition, `x AS (`, `x (a, b) AS MATERIALIZED (`, in a fragment's top level.
_CTE = re.compile(
    r"(?<![\w$])\$?\w+(?:\s*\(\))?\s+AS\s+(?:(?:NOT\s+)?MATERIALIZED\s+)?\(\)", re.IGNORECASE
)


def top_level(sql: str) -> str:
    """`sql` with its string literals emptied and what its parentheses hold left out."""
    kept, depth = [], 0
    for char in re.sub(r"'(?:[^']|'')*'", "''", sql):
        if char == ")":
            depth -= 1
        if depth == 0:
            kept.append(char)
        if char == "(":
            depth += 1
    return "".join(kept)


def test_no_fragment_defines_a_cte() -> None:
    """Every CTE a statement uses is named in the statement's own text (sql/shared.sql).

    A fragment is an expression, a clause or a CTE's body; a fragment that is a query of its
    own (it opens with WITH) may define CTEs of its own, which nothing outside it sees.
    """
    _, fragments = written(SOURCE)
    defining: dict[str, list[str]] = {}
    for name, fragment in fragments.items():
        top = top_level(fragment.body)
        if not top.lstrip().upper().startswith("WITH") and _CTE.search(top):
            defining[name] = _CTE.findall(top)
    assert not defining, defining


def test_statements_are_valid_sql(db: None) -> None:
    """PostgreSQL accepts every statement (PREPARE parses and plans without running it)."""
    with connection.cursor() as cursor:
        for name, sql in queries.items():
            if name == "claim_filtered":  # its scans come from a queryset (querysets.py)
                scan = (
                    "SELECT id, queue, priority, concurrency_key, created_at AS claimable_at"
                    " FROM todos"
                )
                sql = sql.format(ready=scan, due=scan, lapsed=scan)
            without_params = PARAM.sub("NULL", sql)
            cursor.execute(f"PREPARE check_{name} AS {without_params}")
            cursor.execute(f"DEALLOCATE check_{name}")


def test_state_values_match_the_check_constraint(db: None) -> None:
    """The CHECK constraint on todos.state allows exactly State.values."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conname = 'todos_state_check'"
        )
        definition = cursor.fetchone()[0]
    assert sorted(re.findall(r"'(\w+)'::text", definition)) == sorted(State.values)


def test_schema_indexes_are_exactly_the_justified_ones(db: None) -> None:
    """No index the hot path does not use (such as Django's *_like copies of text keys)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename IN ('todos', 'events', 'todo_queues')"
        )
        names = {row[0] for row in cursor.fetchall()}
    assert not {name for name in names if name.endswith("_like")}
    assert {
        "todos_pkey",
        "events_pkey",
        "idx_todos_pending",
        "idx_todos_scheduled",
        "idx_todos_dedupe",
        "idx_todos_lease",
        "idx_todos_event",
        "idx_events_delivery",
    } <= names


def test_raw_sql_insert_gets_every_default(db: None) -> None:
    """Another service can enqueue with plain SQL and the row is a valid pending todo."""
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO todos (queue, title) VALUES ('raw', 'from Go') RETURNING id")
        todo_id = cursor.fetchone()[0]
    todo = Todo.objects.get(pk=todo_id)
    assert re.fullmatch(r"td_[0-9a-f-]{36}", todo.id)
    assert (todo.state, todo.attempt, todo.max_attempts) == (State.PENDING, 0, DEFAULT_MAX_ATTEMPTS)
    assert (todo.payload, todo.errors) == ({}, [])
    assert todo.created_at is not None and todo.updated_at is not None
    assert Todo.objects.claim_next("raw", "w1", 30) == todo


def test_deleting_an_event_unlinks_its_todos_in_the_database(db: None) -> None:
    """The foreign key is ON DELETE SET NULL in PostgreSQL, whoever deletes the event."""
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO events (source, kind) VALUES ('github', 'push') RETURNING id")
        event_id = cursor.fetchone()[0]
        todo, _ = Todo.objects.create_todo(kind="k", event=event_id)
        cursor.execute("DELETE FROM events WHERE id = %s", [event_id])
    assert Todo.objects.get(pk=todo.pk).event_id is None


def explain(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The JSON plan of a named statement, without running it."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {queries[name]}", params)
        plan = cursor.fetchone()[0]
    return (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]  # type: ignore[no-any-return]


def nodes(plan: dict[str, Any], *, leaving_out: str = "") -> list[dict[str, Any]]:
    """Every node of `plan`, but the subtree of the subplan named `leaving_out` ("CTE x")."""
    if leaving_out and plan.get("Subplan Name") == leaving_out:
        return []
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(nodes(child, leaving_out=leaving_out))
    return found


def inputs(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes whose rows flow into `plan`: its subtree without the CTEs and subplans."""
    found = []
    for child in plan.get("Plans", []):
        if child["Parent Relationship"] not in ("InitPlan", "SubPlan"):
            found.extend([child, *inputs(child)])
    return found


@pytest.fixture(params=[False, True], ids=["one priority", "mixed priorities"])
def backlog(request: pytest.FixtureRequest, db: None, vacuumed: None) -> None:
    """Sixty thousand pending todos over three queues, some waiting for a retry; analyzed.

    With mixed priorities, every priority from -100 to 100 is used. Below some 20,000 rows a
    queue's scan of the priorities without a mark is expected to match fewer rows than its cap
    of 1000, and the planner may read them through a bitmap and sort them, which a claim of a
    few todos must not do (test_a_claim_of_a_few_follows_the_index_of_queues_it_has_no_mark_for).
    The property that matters here, that no claim sorts a large backlog, needs a backlog.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO todos (queue, kind, created_at, fair_at, next_retry_at, priority)
            SELECT (ARRAY['a', 'b', 'c'])[1 + g %% 3], 'k', now() - g * interval '1 second',
                   now() - g * interval '1 second',
                   CASE WHEN g %% 10 = 0 THEN now() + interval '1 hour' END,
                   CASE WHEN %s THEN g %% 201 - 100 ELSE 0 END
              FROM generate_series(1, 60000) AS g
            """,
            [request.param],
        )
        # Every row in the sample (300 per unit of the target), so that the statistics, and
        # with them the plans, are the same at every run rather than those of a random sample.
        cursor.execute("SET LOCAL default_statistics_target = 200")
        cursor.execute("ANALYZE todos")


def explain_generic(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The JSON plan a prepared statement `name` runs with when it keeps its generic plan."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in order:
            order.append(match.group(1))
        return f"${order.index(match.group(1)) + 1}"

    body = PARAM.sub(number, queries[name])
    with connection.cursor() as cursor:
        cursor.execute(f"PREPARE generic_{name} AS {body}")
        try:
            cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            arguments = ", ".join(["%s"] * len(order))
            cursor.execute(
                f"EXPLAIN (FORMAT JSON) EXECUTE generic_{name}({arguments})",
                [params[key] for key in order],
            )
            plan = cursor.fetchone()[0]
        finally:
            cursor.execute(f"DEALLOCATE generic_{name}")
    return (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]  # type: ignore[no-any-return]


def claim_marks(queues: list[str], *, known: bool) -> dict[str, Any]:
    """The marks of a full scan; or, `known`, of a claim with marks at priorities 50, 0, -50
    of every queue (at the head, so that the plan sees the whole backlog)."""
    own = Marks()
    if known:
        own.for_claim("default", queues)  # the first claim is a full scan
        own.claimed(
            "default",
            [(queue, p, FROM_HEAD + MARK_SLACK) for queue in queues for p in (50, 0, -50)],
        )
    return own.for_claim("default", queues).params()


def claim_params(
    queues: list[str], limit: int, *, owner: str = "w1", known: bool = False
) -> dict[str, Any]:
    """The parameters of a claim of up to `limit` todos of `queues` for `owner`, with the
    defaults' lease and failure history, and the marks of claim_marks."""
    return {
        "queues": queues,
        "owner": owner,
        "ttl": "30s",
        "default_ttl": "30s",
        "limit": limit,
        "max_held": None,
        "credential": None,
        "max_errors_kept": 20,
        "max_error_history_bytes": 262144,
        **claim_marks(queues, known=known),
    }


CLAIM_INDEXES = {
    "idx_todos_pending",
    "idx_todos_scheduled",
    "idx_todos_lease",
    "idx_todos_held",
    "idx_todos_key_claimed",
    "idx_todos_key_order",
    "idx_todos_slot",
    "todos_pkey",
    "todo_queues_pkey",
    # The failure history of a todo whose expired lease the claim takes over (taken_over).
    "idx_todo_errors_todo",
    "todo_errors_pkey",
    # A remote agent's credential, checked in the claim (credential_holds).
    "todo_agents_name_key",
}


#: What a claim may sort of todos it read: a twentieth of one queue's backlog in `backlog`.
FEW_ROWS = 1000


@pytest.mark.parametrize("generic", [False, True], ids=["planned", "generic"])
@pytest.mark.parametrize("queues", [["a"], ["a", "b"], ["a", "b", "c", "d"]])
def test_claim_next_is_an_index_scan_per_queue(
    backlog: None, queues: list[str], generic: bool
) -> None:
    """For one queue or several, the claim never scans or sorts the backlog itself.

    The same holds for the generic plan a prepared claim runs with (cursors.py), which is
    made without knowing the queues or the limit.
    """
    params = claim_params(queues, 1, known=generic)
    plan = explain_generic("claim_next", params) if generic else explain("claim_next", params)
    scans = {(node["Node Type"], node.get("Index Name")) for node in nodes(plan)}
    assert ("Index Scan", "idx_todos_pending") in scans
    assert ("Index Scan", "idx_todos_scheduled") in scans
    todo_scans = [
        node
        for node in nodes(plan)
        if node.get("Relation Name") == "todos" and "Scan" in node["Node Type"]
    ]
    assert all(
        node["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Heap Scan")
        for node in todo_scans
    ), todo_scans
    assert {name for _, name in scans if name} <= CLAIM_INDEXES
    # The only sorts merge the few candidates the per-queue scans returned (none reads todos),
    # order the free slots of a queue with a concurrency limit (reading its claimed todos), and
    # order the rows of one priority of one queue past its mark that the planner expects to be
    # a few: with every priority from -100 to 100 in use, some 30 (a bitmap scan and a sort is
    # then cheaper than the index's order, and is chosen on a table freshly filled).
    for sort in (
        node for node in nodes(plan, leaving_out="CTE free_slot") if node["Node Type"] == "Sort"
    ):
        read = [node for node in inputs(sort) if node.get("Relation Name") == "todos"]
        assert all(node["Plan Rows"] <= FEW_ROWS for node in read), sort


@pytest.mark.parametrize(
    ("name", "limit"), [("claim_one", 1), ("claim_ready_few", 5), ("claim_next_few", 5)]
)
def test_a_claim_of_a_few_follows_the_index_of_queues_it_has_no_mark_for(
    vacuumed: None, db: None, name: str, limit: int
) -> None:
    """A claim of a few todos from three queues of a backlog too small for the planner to
    expect many rows in a queue's unmarked priorities still reads them in the index's order,
    and sorts none of them: under a cap of 1000, the planner read every todo of the queue in a
    bitmap scan and sorted them, at each claim (bench/claim_scale.py: 360 claims a second from
    three queues, 1,450 from one)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO todos (queue, kind, created_at)
            SELECT (ARRAY['a', 'b', 'c'])[1 + g % 3], 'k', now() - g * interval '1 ms'
              FROM generate_series(1, 10000) AS g
            """
        )
        cursor.execute("ANALYZE todos")
    queues = ["a", "b", "c"]
    params = claim_params(queues, limit)
    plan = explain_generic(name, params)
    pending = [
        node["Node Type"] for node in nodes(plan) if node.get("Index Name") == "idx_todos_pending"
    ]
    assert pending and set(pending) == {"Index Scan"}, pending
    sorts = [node for node in nodes(plan) if node["Node Type"] == "Sort"]
    assert not [
        sort
        for sort in sorts
        if any(node.get("Index Name") == "idx_todos_pending" for node in inputs(sort))
    ]


def test_claim_plan_cost_does_not_grow_with_the_backlog(backlog: None) -> None:
    """The generic claim plan's estimate stays put as the backlog doubles.

    An estimate that grew with the backlog would cross jit_above_cost at some size, and
    PostgreSQL would then JIT-compile the plan at every claim (some 25 ms here).
    """
    params = claim_params(["a", "b"], 10, known=True)
    before = explain_generic("claim_next", params)["Total Cost"]
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO todos (queue, kind) SELECT 'a', 'k' FROM generate_series(1, 20000)"
        )
        cursor.execute("ANALYZE todos")
    after = explain_generic("claim_next", params)["Total Cost"]
    assert after < before * 1.2, (before, after)


def test_claim_scans_lock_under_the_largest_claim_limit() -> None:
    """The constant that bounds each scan of the claim is the largest claim_batch limit, and
    in the claims of a few, the largest limit they are run for."""
    caps = {
        "claim_next": validation.CLAIM_BATCH_LIMIT,
        "claim_ready": validation.CLAIM_BATCH_LIMIT,
        "claim_next_few": claiming.FEW,
        "claim_ready_few": claiming.FEW,
        "claim_one": 1,
    }
    for name, cap in caps.items():
        assert set(re.findall(r"LIMIT (\d+)\s+FOR UPDATE", queries[name])) == {str(cap)}, name


@pytest.mark.django_db(transaction=True)
def test_a_claim_past_the_few_cap_takes_its_whole_limit() -> None:
    """A claim of more than FEW todos runs a statement whose scans may lock that many: the
    first claim (a full scan, from the head) and the next (lean, from its marks) each take
    their whole limit, as a claim of FEW does."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO todos (queue, kind) SELECT 'q', 'k' FROM generate_series(1, 600)"
        )
    for limit in (claiming.FEW + 1, claiming.FEW + 1, claiming.FEW, claiming.FEW):
        assert len(Todo.objects.claim_batch("q", "w1", 30, limit)) == limit


def test_reap_uses_the_lease_index(backlog: None) -> None:
    """The reaper reads only in-flight rows, through idx_todos_lease."""
    plan = explain("reap_expired", with_history({"notify": True, "limit": 1000}))
    assert "idx_todos_lease" in {node.get("Index Name") for node in nodes(plan)}


def test_create_todo_conflict_target_matches_the_dedupe_index(db: None) -> None:
    """ON CONFLICT infers idx_todos_dedupe (a mismatch would be an error, not a duplicate)."""
    params = {
        "queue": "q",
        "source": "",
        "kind": "k",
        "title": "",
        "payload": "{}",
        "event_id": None,
        "idempotency_key": "key",
        "assignee": None,
        "max_attempts": 5,
        "default_max_attempts": 5,
        "priority": 0,
        "concurrency_key": None,
        "fair_key": None,
        "run_after": None,
        "notify": True,
        "trace_context": None,
    }
    plan = explain("create_todo", params)
    conflicts = [node for node in nodes(plan) if node.get("Conflict Resolution")]
    assert conflicts[0]["Conflict Arbiter Indexes"] == ["idx_todos_dedupe"]
