"""`manage.py todo_stats`: the queue health page's numbers, as a table, JSON or Prometheus text."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from switchboard_todos import stats
from switchboard_todos.management.base import (
    OperatorCommand,
    add_database_argument,
    add_queue_argument,
    chosen_databases,
)
from switchboard_todos.upkeep import vacuum

COLUMNS = [
    ("queue", "queue"),
    ("ready", "ready"),
    ("scheduled", "waiting"),
    ("blocked", "blocked"),
    ("claimed", "claimed"),
    ("lease_expired", "expired"),
    ("done_recently", "done 24h"),
    ("dead", "dead"),
    ("oldest_ready", "oldest ready"),
]


class Command(OperatorCommand):
    help = (
        "Print each queue's health: todos ready to claim, waiting (in backoff or before their "
        "run_after), blocked (by other todos), claimed (lease "
        "valid), claimed with an expired lease, done in the last 24 hours, dead letters, and the "
        "age of the oldest ready todo; the tenants waiting in each queue (fair keys with pending "
        "todos: how many, the deepest and the longest waiting, and the todos without a key); "
        "then who holds back vacuum (the xmin horizon) and the "
        "todos table's dead rows, with warnings; for each database that holds todos. Cheap "
        "enough to run every minute from monitoring."
    )

    examples = [
        "manage.py todo_stats",
        "manage.py todo_stats --queue mail --queue billing",
        "manage.py todo_stats --database eu",
        'manage.py todo_stats --json   # {"at": ..., "queues": [...], "vacuum": {...}}',
        "manage.py todo_stats --prometheus   # the metrics view's text, e.g. for a textfile",
    ]

    def add_arguments(self, parser: ArgumentParser) -> None:
        add_queue_argument(parser, "Only this queue; repeat for several. Default: every queue.")
        add_database_argument(
            parser, "Only this database; repeat for several. Default: every one with todos."
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print JSON for monitoring; oldest_ready_age is in seconds (null if none ready).",
        )
        parser.add_argument(
            "--prometheus",
            action="store_true",
            help="Print every queue's metrics in Prometheus' text format (needs the [metrics] "
            "extra).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["prometheus"]:
            from switchboard_todos import metrics  # the [metrics] extra, only when asked

            self.stdout.write(metrics.exposition().decode(), ending="")
            return
        databases = chosen_databases(options)
        found = [
            (alias, stats.queue_health(options["queues"], using=alias), vacuum.vacuum_health(alias))
            for alias in databases
        ]
        tenants = {
            alias: {
                shares.queue: shares for shares in stats.fair_shares(options["queues"], using=alias)
            }
            for alias in databases
        }
        if options["json"]:
            first = found[0][2]
            report = {
                "at": first.at.isoformat(),
                "queues": [
                    {
                        **row.as_json(),
                        "database": alias,
                        "tenants": tenants_json(tenants[alias].get(row.queue), row),
                    }
                    for alias, rows, _ in found
                    for row in rows
                ],
                "vacuum": first.as_json(),
                "databases": {alias: {"vacuum": health.as_json()} for alias, _, health in found},
            }
            self.stdout.write(json.dumps(report, indent=2))
            return
        for number, (alias, rows, health) in enumerate(found):
            if len(found) > 1:
                self.stdout.write(("\n" if number else "") + f"Database {alias!r}:")
            self.stdout.write(render_table(rows) if rows else "No todos.")
            self.stdout.write("")
            if tenants[alias]:
                self.stdout.write(render_tenants(tenants[alias], rows))
                self.stdout.write("")
            self.stdout.write(render_vacuum(health))


def render_table(rows: list[stats.QueueHealth]) -> str:
    """Align the rows under COLUMNS' headings; numbers right-aligned."""
    cells = [[str(getattr(row, name)) or "-" for name, _heading in COLUMNS] for row in rows]
    headings = [heading for _name, heading in COLUMNS]
    widths = [max(len(line[i]) for line in [headings, *cells]) for i in range(len(COLUMNS))]
    lines = []
    for line in [headings, *cells]:
        first, *numbers = line
        lines.append(
            "  ".join(
                [first.ljust(widths[0])]
                + [cell.rjust(width) for cell, width in zip(numbers, widths[1:], strict=True)]
            )
        )
    return "\n".join(lines)


def tenants_json(shares: stats.FairShares | None, row: stats.QueueHealth) -> dict[str, Any]:
    """A queue's tenants for monitoring: no keys (and every pending todo unkeyed) when none."""
    found = shares or stats.FairShares(row.queue, 0, 0, (), ())
    return {**found.as_json(), "unkeyed": found.unkeyed(row)}


def render_tenants(tenants: dict[str, stats.FairShares], rows: list[stats.QueueHealth]) -> str:
    """Each queue with fair keys waiting: how many, the deepest and the longest waiting."""
    health = {row.queue: row for row in rows}
    lines = ["Tenants (fair keys with pending todos):"]
    for queue, shares in tenants.items():
        lines += [
            f"{queue}: {shares.keys:,} keys, {shares.keyed:,} pending; "
            f"{shares.unkeyed(health.get(queue)):,} pending without a key",
            "  deepest: " + ", ".join(f"{fair.key} {fair.depth:,}" for fair in shares.by_depth),
            "  waiting longest: "
            + ", ".join(f"{fair.key} {fair.oldest}" for fair in shares.by_age),
        ]
    return "\n".join(lines)


def render_vacuum(health: vacuum.VacuumHealth) -> str:
    """The xmin horizon's holder, the table's dead rows, then each warning on a line."""
    holder = health.holder
    if holder is None:
        horizon = "nothing else holds a snapshot"
    else:
        opened = f", open {holder.age_text}" if holder.age_text else ""
        horizon = (
            f"{holder.kind} pid {holder.pid or '-'} ({holder.application or 'no name'}, "
            f"{holder.state}{opened}), {holder.xids:,} transactions behind"
        )
    vacuumed = (
        f"vacuumed {health.since_vacuum_text} ago" if health.since_vacuum_text else "never vacuumed"
    )
    lines = [
        f"xmin horizon: {horizon}",
        f"todos table: {health.live_tuples:,} live rows, {health.dead_tuples:,} dead, {vacuumed}",
    ]
    return "\n".join(lines + [f"WARNING: {warning}" for warning in health.warnings])
