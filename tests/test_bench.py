"""The benchmark runs: every scenario prints its figures at the smallest size (no timings)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import psycopg
import pytest
from psycopg import sql

from bench import celery_brokers
from bench import setup as bench_setup
from bench.__main__ import SCENARIOS
from tests.conftest import ROOT, database_url

pytestmark = pytest.mark.django_db(transaction=True)

#: A line of the final table per figure, by scenario module.
ROWS = {
    "enqueue": ["enqueue one at a time"],
    "batch_enqueue": [
        "enqueue in batches of 500, create_many",
        "enqueue in batches of 500, enqueue_many",
        "enqueue in batches of 1000, create_many",
        "enqueue in batches of 1000, enqueue_many",
    ],
    "drain_single": ["claim_next + complete, 1 process", "claim_next + complete, 2 processes"],
    "drain_worker": ["no-op handler, 1 process", "no-op handler, 2 processes"],
    "pickup": [
        "latency median, LISTEN/NOTIFY",
        "latency p99, LISTEN/NOTIFY",
        "latency median, polling",
        "latency p99, polling",
    ],
    "claim_scale": ["1,000 pending, 1 queue", "1,000 pending, 3 queues"],
    "http_agents": ["HTTP agents, claim + complete, 2 agents", "long-poll pickup latency median"],
    "mcp_agents": ["MCP agents, claim + complete, 2 agents"],
    "sqs_agents": [
        "SQS send_message_batch of 10",
        "SQS receive_message(10) + delete_message_batch",
    ],
    "two_databases": [
        "drain, one database, Workers on both queues",
        "drain, two databases, Workers on both queues",
    ],
    "blocked": [
        "drain (single) with 1,000 blocked todos, 1 process",
        "drain (single) with 1,000 blocked todos, 2 processes",
        "drain (worker) with 1,000 blocked todos, 1 process",
        "drain (worker) with 1,000 blocked todos, 2 processes",
    ],
    "hostile_agent": [
        "hostile agent (long polls): 1 agent claim + complete",
        "hostile agent (long polls): claim p99",
        "hostile agent (long polls, creates, fails): 1 agent claim + complete",
        "hostile agent (long polls, creates, fails): claim p99",
        "hostile agent (long polls, creates, fails of 1 KiB): 1 agent claim + complete",
        "hostile agent (long polls, creates, fails of 1 KiB): claim p99",
        "hostile agent (children on shared parents): 1 agent claim + complete",
        "hostile agent (children on shared parents): claim p99",
        "hostile agent (refused plans): 1 agent claim + complete",
        "hostile agent (refused plans): claim p99",
        "hostile agent (concurrent creates): 1 agent claim + complete",
        "hostile agent (concurrent creates): claim p99",
    ],
    "sqs_clients": ["Celery tasks over SQS", "dramatiq tasks over SQS"],
    # Beside the brokers that run on this machine.
    "celery_brokers": celery_brokers.rows(),
    "queue_limits": [
        "drain with a queue row that limits nothing, 1 process",
        "drain with a queue row that limits nothing, 2 processes",
        "drain with a concurrency limit not reached, 1 process",
        "drain with a concurrency limit not reached, 2 processes",
        "rate limit 100 per 1 s, 2 processes: achieved",
    ],
    "fair_queue": [
        "quiet keys' dwell beside 5,000 todos of one key, p50",
        "quiet keys' dwell beside 5,000 todos of one key, p99",
        "FIFO (no keys), quiet todos' dwell beside 5,000 todos, p50",
        "FIFO (no keys), quiet todos' dwell beside 5,000 todos, p99",
        "a quiet create's round trip beside 5,000 todos of one key, p50",
        "the noisy key's 5,000 todos beside the quiet keys",
        "the noisy key's 5,000 todos, the quiet keys enqueuing to another queue",
    ],
    "fair_cost": [
        "1,000 todos of 1,000 fair keys, 2 processes",
        "fair key (10 keys), create_todo, one at a time",
        "fair key (10 keys), create_many, batches of 500",
        "fair key (10 keys), enqueue_many, batches of 500",
        "beside 1,000 todos of another queue, create_todo, one at a time",
        "beside 1,000 todos of another queue, create_many, batches of 500",
        "beside 1,000 todos of another queue, enqueue_many, batches of 500",
        "claim one todo, 1,000 pending of 10 fair keys",
    ],
}


# Every scenario at its smallest size, Celery's and dramatiq's included: a suite of third-party
# clients, run in one CI leg (the Django version changes nothing the benchmarks measure).
@pytest.mark.clients
@pytest.mark.timeout(330)
def test_every_scenario_runs_and_prints_its_ratios(subprocess_env: dict[str, Any]) -> None:
    """`python -m bench --smoke` runs every scenario, ours and raw, and prints each ratio."""
    assert set(ROWS) == set(SCENARIOS)
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke"],
        cwd=ROOT,
        env={**subprocess_env, "BENCH_DATABASE_URL": database_url()},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    table = result.stdout.split("\n\n")[-1].splitlines()
    assert table[0].startswith("| scenario ")
    printed = table[2:]
    expected = [row for rows in ROWS.values() for row in rows]
    assert len(printed) == len(expected)
    for scenario in expected:
        [line] = [line for line in printed if scenario in line]
        ratio = line.strip("|").split("|")[3]
        assert float(ratio.split()[0]) > 0, line


def test_a_scratch_database_of_another_version_is_made_again(
    subprocess_env: dict[str, Any],
) -> None:
    """A benchmark database whose recorded migrations this code lacks is dropped and migrated.

    A CI machine keeps its databases between runs; one run's migration renamed by the next
    made `migrate` add a column that was already there, and the smoke run failed before it began.
    """
    url = f"{database_url()}_stale"
    configure = [sys.executable, "-c", "from bench.setup import configure; configure()"]
    env = {**subprocess_env, "BENCH_DATABASE_URL": url}
    try:
        subprocess.run(configure, cwd=ROOT, env=env, check=True, timeout=120)
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(
                "UPDATE django_migrations SET name = '0013_renamed_since'"
                " WHERE app = 'switchboard_todos' AND name = '0013_dependencies'"
            )
        result = subprocess.run(
            configure, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr
        with psycopg.connect(url) as connection:
            names = connection.execute(
                "SELECT name FROM django_migrations WHERE app = 'switchboard_todos'"
            ).fetchall()
        assert ("0013_dependencies",) in names
        assert ("0013_renamed_since",) not in names
    finally:
        server, _, name = url.rpartition("/")
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.mark.parametrize(
    ("environment", "url"),
    [
        ({"BENCH_DATABASE_URL": "postgres://h/mine"}, "postgres://h/mine"),
        ({"DATABASE_URL": "postgres://u@h:5433/shop"}, "postgres://u@h:5433/shop_bench"),
        ({"DATABASE_URL": "postgres://u@h:5433/"}, "postgres://u@h:5433/switchboard_bench"),
        ({}, "postgres://postgres@127.0.0.1:5432/switchboard_bench"),
    ],
)
@pytest.mark.django_db(transaction=False)
def test_each_project_database_has_its_own_benchmark_database(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], url: str
) -> None:
    """Two checkouts with databases of their own never empty each other's benchmark tables."""
    monkeypatch.delenv("BENCH_DATABASE_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert bench_setup.database_url() == url
