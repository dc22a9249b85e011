"""Prometheus metrics: read from the table at scrape time, served by a view and by todo_stats."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db.models import F
from django.test import Client
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from switchboard_todos.models import State, Todo
from tests.asgi import serve

MakeTodo = Callable[..., Todo]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(name, sorted labels): value} of every sample in an exposition."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


#: What Prometheus sends (tests/settings.py's SWITCHBOARD_TODOS_METRICS_TOKEN).
SCRAPER = {"Authorization": "Bearer metrics-test-token"}


def scrape(client: Client, settings: Any) -> str:
    """GET /metrics as the example project mounts it, as Prometheus does."""
    settings.ROOT_URLCONF = "example_project.urls"
    response = client.get("/metrics", headers=SCRAPER)
    assert response.status_code == 200
    assert response["Content-Type"] == CONTENT_TYPE_LATEST
    return response.content.decode()


@pytest.fixture
def busy(make_todo: MakeTodo) -> None:
    """A queue in every situation, with the times on the database's clock."""
    make_todo(queue="mail", created_ago=timedelta(minutes=10))
    make_todo(queue="mail", next_retry_in=timedelta(minutes=-30))
    make_todo(queue="mail", next_retry_in=timedelta(minutes=5))
    running = make_todo(queue="mail", state=State.CLAIMED)
    make_todo(queue="mail", state=State.CLAIMED, lease_expires_in=timedelta(seconds=-1))
    Todo.objects.create_todo(queue="mail", kind="merge", after=[running.id])
    make_todo(queue="mail", state=State.DONE)
    make_todo(queue="mail", state=State.FAILED)
    old = make_todo(queue="mail", state=State.DONE)
    Todo.objects.filter(pk=old.pk).update(completed_at=F("completed_at") - timedelta(minutes=6))


def test_the_metrics_count_each_queue_and_state(busy: None, client: Client, settings: Any) -> None:
    found = samples(scrape(client, settings))
    mail = (("queue", "mail"),)
    for state, count in [
        ("ready", 2),
        ("scheduled", 1),
        ("blocked", 1),
        ("claimed", 1),
        ("lease_expired", 1),
        ("dead", 1),
    ]:
        assert found["switchboard_todos_todos", (*mail, ("state", state))] == count, state
    assert found["switchboard_todos_oldest_ready_age_seconds", mail] == 1800
    # Finished within the last five minutes: the one done six minutes ago is not counted.
    assert found["switchboard_todos_completed_recently", mail] == 1
    assert found["switchboard_todos_dead_lettered_recently", mail] == 1
    assert found["switchboard_todos_fair_keys_waiting", mail] == 0
    for name in [
        "switchboard_todos_xmin_horizon_age_seconds",
        "switchboard_todos_xmin_horizon_xids",
        "switchboard_todos_table_dead_tuples",
        "switchboard_todos_table_live_tuples",
    ]:
        assert found[name, (("database", "default"),)] >= 0


def test_the_metrics_count_the_fair_keys_waiting(
    make_todo: MakeTodo, client: Client, settings: Any
) -> None:
    """Keys with pending todos, ready or not; a key whose todos are all claimed waits no more."""
    make_todo(queue="imports", fair_key="a")
    make_todo(queue="imports", fair_key="a", next_retry_in=timedelta(minutes=5))
    make_todo(queue="imports", fair_key="b", priority=3)
    make_todo(queue="imports", fair_key="c", state=State.CLAIMED)
    make_todo(queue="imports")
    make_todo(queue="mail", fair_key="c", state=State.CLAIMED)
    found = samples(scrape(client, settings))
    assert found["switchboard_todos_fair_keys_waiting", (("queue", "imports"),)] == 2
    assert found["switchboard_todos_fair_keys_waiting", (("queue", "mail"),)] == 0


def test_a_scrape_costs_the_same_queries_whatever_the_rows(
    make_todo: MakeTodo,
    client: Client,
    settings: Any,
    django_assert_num_queries: Any,
) -> None:
    """One statement for the queues, one for their fair keys, two on PostgreSQL's statistics
    views."""
    for count in (1, 20):
        for n in range(count):
            make_todo(queue=f"q{n % 7}", fair_key=f"k{n}")
        with django_assert_num_queries(4):
            scrape(client, settings)


def test_the_view_answers_get_only(db: None, client: Client, settings: Any) -> None:
    settings.ROOT_URLCONF = "example_project.urls"
    assert client.post("/metrics").status_code == 405


def test_the_metrics_are_for_the_scraper_and_staff_only(
    db: None, client: Client, settings: Any
) -> None:
    settings.ROOT_URLCONF = "example_project.urls"
    for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic bWV0cmljcw=="}]:
        refused = client.get("/metrics", headers=headers)
        assert refused.status_code == 401
        assert refused["WWW-Authenticate"] == 'Bearer realm="metrics"'
    client.force_login(User.objects.create_user("someone", password="pw"))
    assert client.get("/metrics").status_code == 403
    client.force_login(User.objects.create_user("operator", password="pw", is_staff=True))
    assert client.get("/metrics").status_code == 200
    settings.SWITCHBOARD_TODOS_METRICS_TOKEN = ""
    client.logout()
    assert client.get("/metrics", headers={"Authorization": "Bearer "}).status_code == 401


@pytest.mark.django_db(transaction=True)
def test_a_live_server_refuses_the_metrics_without_the_token(
    subprocess_env: dict[str, str],
) -> None:
    """Served as the example project serves them (Django behind AgentsAPIFirst, uvicorn)."""
    with serve(subprocess_env) as (api, process):
        base = api.removesuffix("/api")
        assert httpx.get(f"{base}/metrics").status_code == 401
        scraped = httpx.get(f"{base}/metrics", headers=SCRAPER)
        process.terminate()
        assert "Traceback" not in process.communicate(timeout=30)[0]
    assert scraped.status_code == 200
    assert "switchboard_todos_todos" in scraped.text


def test_todo_stats_prints_the_same_metrics(busy: None, client: Client, settings: Any) -> None:
    out = StringIO()
    call_command("todo_stats", "--prometheus", stdout=out)
    printed, served = samples(out.getvalue()), samples(scrape(client, settings))
    assert printed.keys() == served.keys()
    key = ("switchboard_todos_todos", (("queue", "mail"), ("state", "ready")))
    assert printed[key] == served[key] == 2


def test_the_queue_never_imports_prometheus_client(
    db: None, subprocess_env: dict[str, str]
) -> None:
    """Without the [metrics] extra everything but the metrics runs: nothing else imports it."""
    script = (
        "import sys, django; django.setup()\n"
        "from django.core.management import call_command\n"
        "import switchboard_todos.admin, switchboard_todos.worker, switchboard_todos.backends\n"
        "call_command('todo_stats', '--json')\n"
        "assert 'prometheus_client' not in sys.modules, 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", script], env=subprocess_env, check=True, timeout=60)
