"""Measure the admin at scale: query counts and times of the todo list and the health page.

Run by hand, against a development database (never a test one):

    export DATABASE_URL=postgres://postgres@127.0.0.1:5432/sb_admin
    python bench/admin_changelist.py --populate 1000000   # migrate, fill, VACUUM ANALYZE
    python bench/admin_changelist.py                      # measure only

The fill is one INSERT ... SELECT generate_series with a realistic mix: mostly done, a few
percent pending (a quarter of them in backoff, a quarter blocked by other
todos), some claimed (a tenth of those with an expired lease) and dead letters, over eight queues
of uneven size and thirty days. Then a plan: 40 parts and a merge blocked by them, whose page
draws the graph.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

from django.contrib.admin.utils import quote  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from switchboard_todos.models import Todo  # noqa: E402

FILL = """
INSERT INTO todos (id, queue, kind, title, payload, idempotency_key, assignee, state, owner,
                   lease_expires_at, attempt, max_attempts, next_retry_at, waiting_for, result,
                   created_at, updated_at, claimed_at, completed_at)
SELECT 'td_' || gen_random_uuid(),
       queue,
       queue || '.' || (ARRAY['send', 'sync', 'index', 'notify'])[1 + n %% 4],
       'Todo number ' || n || ' for ' || queue,
       jsonb_build_object('n', n),
       CASE WHEN n %% 5 <> 0 THEN 'delivery-' || n END,
       CASE WHEN n %% 200 = 0 THEN 'agent-' || (n %% 3) END,
       state,
       CASE WHEN state IN ('claimed', 'done') THEN 'worker-' || (n %% 16) END,
       CASE WHEN state = 'claimed'
            THEN now() + CASE WHEN n %% 10 = 0 THEN interval '-2 minutes'
                              ELSE interval '5 minutes' END END,
       CASE WHEN state = 'failed' THEN 5 WHEN state = 'pending' THEN n %% 2 ELSE 1 END,
       5,
       CASE WHEN state = 'pending' AND n %% 4 = 0 THEN now() + interval '10 minutes'
            WHEN state = 'pending' AND n %% 4 = 1 THEN '9999-01-01 00:00:00+00' END,
       CASE WHEN state = 'pending' AND n %% 4 = 1 THEN 1 ELSE 0 END,
       CASE WHEN state = 'done' THEN '{"ok": true}'::jsonb
            WHEN state = 'failed' THEN '{"type": "TimeoutError", "message": "upstream"}'::jsonb
       END,
       created,
       created,
       CASE WHEN state <> 'pending' THEN created + interval '1 second' END,
       CASE WHEN state IN ('done', 'failed') THEN created + interval '30 seconds' END
  FROM (
        SELECT n,
               (ARRAY['default', 'mail', 'mail', 'mail', 'billing', 'webhooks', 'webhooks',
                      'search', 'reports', 'sync', 'media', 'default'])[1 + (n * 7) %% 12] AS queue,
               CASE WHEN n %% 100 < 90 THEN 'done'
                    WHEN n %% 100 < 94 THEN 'pending'
                    WHEN n %% 100 < 95 THEN 'claimed'
                    ELSE 'failed' END AS state,
               now() - interval '30 days' * (1 - n::float8 / %(total)s) AS created
          FROM generate_series(1, %(total)s) AS n
       ) AS generated
"""


def populate(total: int) -> None:
    """Migrate, replace every todo with `total` generated ones, then VACUUM ANALYZE."""
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE todos")
        started = time.perf_counter()
        cursor.execute(FILL, {"total": total})
        print(f"inserted {total:,} todos in {time.perf_counter() - started:.1f} s")
        Todo.objects.create_many(
            [{"queue": "reports", "kind": "part", "ref": f"part-{n}"} for n in range(40)]
            + [{"queue": "reports", "kind": "merge", "after": [f"part-{n}" for n in range(40)]}]
        )
        cursor.execute("VACUUM ANALYZE todos")


#: The indexes migration 0004 adds to `todos` for the admin (see Todo.Meta.indexes).
ADMIN_INDEXES = {
    "idx_todos_created",
    "idx_todos_queue",
    "idx_todos_dead",
    "idx_todos_key",
    "idx_todos_assignee",
}

#: A todo's life in bulk: enqueue, claim, heartbeat, complete; %(n)s todos at a time.
LIFECYCLE = [
    (
        "insert",
        "INSERT INTO bench_todos (id, queue, kind, idempotency_key) "
        "SELECT 'td_' || gen_random_uuid(), 'q' || n %% 8, 'k', 'key-' || n "
        "FROM generate_series(1, %(n)s) AS n",
    ),
    (
        "claim",
        "UPDATE bench_todos SET state = 'claimed', owner = 'w', attempt = attempt + 1, "
        "lease_expires_at = now() + interval '30 seconds', claimed_at = now() "
        "WHERE state = 'pending'",
    ),
    (
        "heartbeat",
        "UPDATE bench_todos SET lease_expires_at = now() + interval '60 seconds' "
        "WHERE state = 'claimed'",
    ),
    (
        "complete",
        "UPDATE bench_todos SET state = 'done', result = '{}', lease_expires_at = NULL, "
        "completed_at = now() WHERE state = 'claimed'",
    ),
]


def write_cost(count: int) -> None:
    """Time a bulk lifecycle on a copy of `todos` with and without the admin's indexes."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'todos'")
        definitions = [row[0] for row in cursor.fetchall()]
        totals = {}
        for variant in ("without", "with"):
            cursor.execute("DROP TABLE IF EXISTS bench_todos")
            cursor.execute("CREATE TABLE bench_todos (LIKE todos INCLUDING DEFAULTS)")
            for definition in definitions:
                name = re.search(r"INDEX (\w+) ON", definition)
                if variant == "without" and name and name.group(1) in ADMIN_INDEXES:
                    continue
                cursor.execute(
                    re.sub(
                        r"INDEX (\w+) ON (\w+\.)?todos ",
                        r"INDEX bench_\1 ON bench_todos ",
                        definition,
                    )
                )
            steps = []
            for step, sql in LIFECYCLE:
                started = time.perf_counter()
                cursor.execute(sql, {"n": count})
                steps.append(f"{step} {(time.perf_counter() - started) * 1000:.0f} ms")
            totals[variant] = sum(float(part.split()[1]) for part in steps)
            print(f"  {variant:7} admin indexes: " + ", ".join(steps))
        cursor.execute("DROP TABLE bench_todos")
    print(f"  lifecycle cost with / without: {totals['with'] / totals['without']:.2f}x")


def measure(client: Client, url: str, repeat: int) -> tuple[int, float]:
    """(queries, median milliseconds) of GET `url`, after one warm-up request."""
    assert client.get(url).status_code == 200, url
    times, counts = [], []
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, url
        counts.append(len(queries))
    return max(counts), statistics.median(times)


def timed_sql(sql: str, repeat: int) -> float:
    """Median milliseconds of a raw statement: what the admin avoids, for comparison."""
    times = []
    with connection.cursor() as cursor:
        for _ in range(repeat):
            started = time.perf_counter()
            cursor.execute(sql)
            cursor.fetchall()
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--populate", type=int, metavar="N", help="fill the table with N todos")
    parser.add_argument("--repeat", type=int, default=5, help="requests per page (median)")
    parser.add_argument(
        "--write-cost",
        type=int,
        metavar="N",
        help="also time enqueue/claim/heartbeat/complete of N todos with and without the "
        "admin's indexes (on a scratch copy of the table)",
    )
    args = parser.parse_args()
    if connection.settings_dict["NAME"].startswith("test_"):
        raise SystemExit("Refusing to run against a test database.")
    if args.populate:
        populate(args.populate)
    user = User.objects.filter(username="bench").first() or User.objects.create_superuser(
        "bench", password=None
    )
    client = Client()
    client.force_login(user)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, idempotency_key FROM todos "
            "WHERE state = 'failed' AND idempotency_key IS NOT NULL LIMIT 1"
        )
        dead_id, dead_key = cursor.fetchone()
        cursor.execute("SELECT kind FROM todos ORDER BY created_at DESC LIMIT 1")
        (kind,) = cursor.fetchone()
        cursor.execute("SELECT id FROM todos WHERE kind = 'merge' AND parents IS NOT NULL LIMIT 1")
        (merge_id,) = cursor.fetchone()
        cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = 'todos'::regclass")
        rows = cursor.fetchone()[0]
    base = "/admin/switchboard_todos/todo/"
    pages: list[tuple[str, str]] = [
        ("default page", base),
        ("state = failed", f"{base}?state__exact=failed"),
        ("dead-lettered", f"{base}?attention=dead"),
        ("lease expired", f"{base}?attention=lease_expired"),
        ("waiting for retry", f"{base}?attention=waiting"),
        ("blocked", f"{base}?attention=blocked"),
        ("queue = billing", f"{base}?queue=billing"),
        (f"kind = {kind}", f"{base}?kind={kind}"),
        ("kind = (none has it)", f"{base}?kind=no.such.kind"),
        ("search by id", f"{base}?q={dead_id}"),
        ("search by key", f"{base}?q={dead_key}"),
        ("search titles (a word)", f"{base}?q=number+12345"),
        ("search titles (no match)", f"{base}?q=nothing+matches"),
        ("one day (hierarchy)", _one_day(base)),
        ("todo detail", f"{base}{quote(dead_id)}/change/"),
        ("todo detail, 40 parents", f"{base}{quote(merge_id)}/change/"),
        ("queue health", f"{base}health/"),
    ]
    print(f"todos: about {rows:,} (pg_class.reltuples); median of {args.repeat} requests")
    print(f"{'page':24} {'queries':>7} {'ms':>8}")
    for name, url in pages:
        queries, millis = measure(client, url, args.repeat)
        print(f"{name:24} {queries:>7} {millis:>8.1f}")
    print("for comparison, what the admin does not run:")
    avoided: list[tuple[str, Callable[[], float]]] = [
        ("SELECT count(*) FROM todos", lambda: timed_sql("SELECT count(*) FROM todos", 3)),
        (
            "date hierarchy DISTINCT",
            lambda: timed_sql(
                "SELECT DISTINCT date_trunc('day', created_at AT TIME ZONE 'UTC') FROM todos", 3
            ),
        ),
    ]
    for name, run in avoided:
        print(f"{name:32} {run():>8.1f} ms")
    if args.write_cost:
        print(f"write cost of the admin's indexes, {args.write_cost:,} todos:")
        write_cost(args.write_cost)


def _one_day(base: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT max(created_at) FROM todos")
        newest = cursor.fetchone()[0]
    return (
        f"{base}?created_at__year={newest.year}&created_at__month={newest.month}"
        f"&created_at__day={newest.day}"
    )


if __name__ == "__main__":
    main()
