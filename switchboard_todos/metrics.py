"""Prometheus metrics, read from the database at scrape time (needs the `[metrics]` extra).

Nothing is counted in the worker processes: every number is read from the todos table's partial
indexes and PostgreSQL's statistics views when Prometheus scrapes, so any number of worker
processes on any number of hosts need no shared state, and every scrape of any web process gives
the same answer. The table keeps states, not a history of events, so there are no counters: the
throughput is given as todos finished within the last `WINDOW`. Mount `view` in the project's
URLconf, or print the same text with `manage.py todo_stats --prometheus`. docs/operating.md
lists the metrics and example alert rules.

The view answers a scraper that sends `Authorization: Bearer <SWITCHBOARD_TODOS_METRICS_TOKEN>`
and a logged-in staff user; anyone else gets 401 (403 for a user who is not staff). The metrics
name every queue and how busy it is: nothing for the public, nor for the agents, which see only
their own queues.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from switchboard_todos import placement, stats
from switchboard_todos.upkeep import vacuum

#: The throughput window: todos finished within it are counted per queue at each scrape.
WINDOW = timedelta(minutes=5)

#: switchboard_todos_todos{state=...}: the label, the QueueHealth field, and what it counts.
STATES = [
    ("ready", "ready", "pending and claimable now"),
    ("scheduled", "scheduled", "pending, in backoff or before its run_after"),
    ("blocked", "blocked", "pending, blocked by other todos until they are done"),
    ("claimed", "claimed", "claimed, lease valid"),
    ("lease_expired", "lease_expired", "claimed, lease expired, not yet taken back"),
    ("dead", "dead", "failed: dead letters"),
]


class TodoCollector(Collector):
    """Reads the numbers at each scrape, in each database that holds todos: a statement for the
    queues' numbers, one for their tenants (fair keys), two on catalog views. A queue lives in
    one database, so `queue` names it; the vacuum gauges are per database."""

    def collect(self) -> Iterator[Metric]:
        databases = placement.todo_databases()
        rows = [
            row for alias in databases for row in stats.queue_health(recent=WINDOW, using=alias)
        ]
        tenants = {
            shares.queue: shares.keys
            for alias in databases
            for shares in stats.fair_shares(top=0, using=alias)
        }
        healths = {alias: vacuum.vacuum_health(alias) for alias in databases}
        window = f"{WINDOW.total_seconds():g} seconds"
        todos = GaugeMetricFamily(
            "switchboard_todos_todos",
            "Todos per queue and state, now: "
            + "; ".join(f"{label}: {meaning}" for label, _field, meaning in STATES),
            labels=["queue", "state"],
        )
        oldest = _per_queue(
            "oldest_ready_age_seconds",
            "Age of the oldest ready todo (how long it has been claimable); 0 when none.",
        )
        done = _per_queue("completed_recently", f"Todos completed within the last {window}.")
        dead = _per_queue(
            "dead_lettered_recently", f"Todos dead-lettered within the last {window}."
        )
        keys = _per_queue(
            "fair_keys_waiting",
            "Fair keys (tenants) with pending todos: ready, in backoff, or blocked.",
        )
        for row in rows:
            for label, field, _meaning in STATES:
                todos.add_metric([row.queue, label], getattr(row, field))
            age = row.oldest_ready_age
            oldest.add_metric([row.queue], 0.0 if age is None else age.total_seconds())
            done.add_metric([row.queue], row.done_recently)
            dead.add_metric([row.queue], row.dead_lettered_recently)
            keys.add_metric([row.queue], tenants.get(row.queue, 0))
        yield from (todos, oldest, done, dead, keys)
        yield from _vacuum_metrics(healths)


def _per_queue(name: str, documentation: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"switchboard_todos_{name}", documentation, labels=["queue"])


def _vacuum_metrics(healths: dict[str, vacuum.VacuumHealth]) -> Iterator[Metric]:
    families = [
        GaugeMetricFamily(f"switchboard_todos_{name}", documentation, labels=["database"])
        for name, documentation in (
            (
                "xmin_horizon_age_seconds",
                "How long the oldest transaction holding back vacuum in this database has been "
                "open (sessions and prepared transactions; replication slots have no time); 0 "
                "when none.",
            ),
            (
                "xmin_horizon_xids",
                "How many transaction ids the oldest snapshot holding back vacuum is behind "
                "(sessions, prepared transactions, replication slots); 0 when none.",
            ),
            (
                "table_dead_tuples",
                "Dead row versions in the todos table, waiting for vacuum (statistics collector).",
            ),
            ("table_live_tuples", "Live rows in the todos table (statistics collector)."),
        )
    ]
    age, xids, dead, live = families
    for alias, health in healths.items():
        holder = health.holder
        held = holder.age if holder is not None else None
        age.add_metric([alias], 0.0 if held is None else held.total_seconds())
        xids.add_metric([alias], 0 if holder is None else holder.xids)
        dead.add_metric([alias], health.dead_tuples)
        live.add_metric([alias], health.live_tuples)
    yield from families


registry = CollectorRegistry(auto_describe=False)
registry.register(TodoCollector())


def exposition() -> bytes:
    """The metrics in Prometheus' text format, read now."""
    return generate_latest(registry)


@never_cache
@require_GET
def view(request: HttpRequest) -> HttpResponse:
    """The metrics for Prometheus to scrape: `path("metrics", metrics.view)` in a URLconf."""
    user = getattr(request, "user", None)
    if not (_scraper(request) or (user is not None and user.is_staff)):
        signed_in = user is not None and user.is_authenticated
        refused = HttpResponse(
            "The metrics are for staff users, and for scrapers that send the header "
            "Authorization: Bearer <SWITCHBOARD_TODOS_METRICS_TOKEN>.\n",
            status=403 if signed_in else 401,
            content_type="text/plain",
        )
        if not signed_in:
            refused["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return refused
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)


def _scraper(request: HttpRequest) -> bool:
    """Whether the request carries the metrics token (none is, while the setting is unset)."""
    token = getattr(settings, "SWITCHBOARD_TODOS_METRICS_TOKEN", None)
    scheme, _, sent = request.headers.get("Authorization", "").partition(" ")
    return (
        bool(token)
        and scheme.lower() == "bearer"
        and hmac.compare_digest(sent.encode(), str(token).encode())
    )
