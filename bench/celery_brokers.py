"""Scenario 16: Celery over the SQS endpoint beside Celery over Redis, RabbitMQ and moto's
SQS server, each set up as its users would, on this machine, in the same run.

The endpoint is set up as docs/celery.md says: uvicorn serving `SQSAnywhere` (one process per
CPU, as in sqs_clients), an agent made with `todo_agent create ... --preset broker`, its secret
from `todo_agent sqs-credentials`, the queue's visibility timeout set to 1800 s, and the
documented `broker_transport_options`. Redis (127.0.0.1:6379) and RabbitMQ (127.0.0.1:5672,
guest/guest) get Celery's defaults, moto's SQS server kombu's but for the region. A broker
that does not run here is left out, with its rows (Redis: the target's reference).

A round, for each broker in turn: this process publishes N no-op tasks with `.delay()`
(publish rate, every call returned), then one prefork worker of concurrency 4 is started on
that backlog, and the drain rate runs from its first task's run to its last (the worker's
start and connection left out), then the worker is stopped. Targets (issue 36): ours at least
0.25x Redis at both, and 2x moto's server.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.harness import Bench, BenchError, Row, Target, reset

#: The prefork worker's processes, as in issue 36's measurement.
CONCURRENCY = 4
REDIS = ("127.0.0.1", 6379)
RABBITMQ = ("127.0.0.1", 5672)
#: The agent the endpoint's Celery sends and works as.
AGENT = "bench-celery-brokers"
#: docs/celery.md's `todo_queue set QUEUE --visibility-timeout`.
VISIBILITY_TIMEOUT = 1800
#: The longest a drain may take: moto's server receives ever slower as its queue grows.
DRAIN_TIMEOUT = 900
#: What each row measures, and its note.
FIGURES = (
    ("publish, .delay() from 1 process", "every call returned"),
    (
        f"drain, 1 prefork worker of {CONCURRENCY}",
        "first task's run to last; the worker started on the backlog",
    ),
)
TARGETS = {"Redis": Target(ratio=0.25), "moto": Target(ratio=2.0)}


@dataclass
class Broker:
    """One broker, a Celery producer on it in this process, and where its worker counts runs."""

    name: str
    url: str
    options: dict[str, Any]
    runs: Path
    #: Empties the queue before a round: the endpoint's table, another broker's purge.
    empty: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        from bench.client_tasks import celery_tick

        self.task = celery_tick(self.url, self.options)
        self.task.delay()  # connects, and makes the queue where the broker does so

    def purge(self) -> None:
        from bench.client_tasks import CELERY_QUEUE

        with self.task.app.connection_for_write() as connection:
            connection.default_channel.queue_purge(CELERY_QUEUE)

    def close(self) -> None:
        self.task.app.pool.force_close_all()
        self.task.app.close()

    @contextlib.contextmanager
    def worker(self) -> Iterator[None]:
        """One prefork worker of CONCURRENCY processes on this broker, stopped on leaving."""
        from bench.client_tasks import CELERY_QUEUE
        from bench.sqs_clients import ROOT, stop

        env = {
            **os.environ,
            "CELERY_BROKER_URL": self.url,
            "BENCH_TRANSPORT_OPTIONS": json.dumps(self.options),
            "BENCH_RUNS": str(self.runs),
        }
        with self.log.open("w") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "celery", "--app", "bench.client_tasks:celery", "worker",
                 "--pool", "prefork", "--concurrency", str(CONCURRENCY), "--loglevel", "WARNING",
                 "--queues", CELERY_QUEUE],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            yield
        finally:
            stop([process])

    @property
    def log(self) -> Path:
        return self.runs.with_suffix(".log")

    def measure(self, count: int) -> tuple[float, float]:
        """Publish `count` tasks, then drain them with a fresh worker; both rates, tasks/s."""
        from bench.sqs_clients import wait

        (self.empty or self.purge)()
        self.runs.write_bytes(b"")
        started = time.monotonic()
        for _ in range(count):
            self.task.delay()
        publish = count / (time.monotonic() - started)
        with self.worker():
            try:
                wait(lambda: self.runs.stat().st_size > 0, f"a first task on {self.name}")
                first = time.monotonic()
                wait(
                    lambda: self.runs.stat().st_size >= 2 * count,
                    f"{count} tasks on {self.name}",
                    timeout=DRAIN_TIMEOUT,
                )
            except BenchError as error:
                raise BenchError(f"{error}; its worker said:\n{self.log.read_text()}") from None
            last = time.monotonic()
        if self.runs.stat().st_size != 2 * count:
            raise BenchError(f"Celery over {self.name}: a task ran more than once")
        return publish, (count - 1) / (last - first)


def answers(address: tuple[str, int]) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(address, timeout=1):
        return True
    return False


def endpoint_secret() -> str:
    """docs/celery.md's set-up of the agent and its queue, by its commands; the agent's secret."""
    from django.core.management import call_command

    from bench.client_tasks import CELERY_QUEUE
    from switchboard_todos.models import Agent

    Agent.objects.filter(name=AGENT).delete()
    quiet = io.StringIO()
    call_command(
        "todo_agent", "create", AGENT, "--queue", CELERY_QUEUE, "--create-queue", CELERY_QUEUE,
        "--preset", "broker", stdout=quiet,
    )  # fmt: skip
    call_command(
        "todo_queue", "set", CELERY_QUEUE, "--visibility-timeout", str(VISIBILITY_TIMEOUT),
        stdout=quiet,
    )  # fmt: skip
    printed = io.StringIO()
    call_command("todo_agent", "sqs-credentials", AGENT, stdout=printed)
    return printed.getvalue().split("AWS_SECRET_ACCESS_KEY=")[1].split()[0]


def references() -> tuple[list[str], list[str]]:
    """The brokers beside the endpoint that run here, and why each other one is left out."""
    present, missing = [], []
    if not answers(REDIS):
        missing.append("Redis ({}:{} does not answer)".format(*REDIS))
    elif importlib.util.find_spec("redis") is None:
        missing.append("Redis (no `redis` package: the dev extra has it)")
    else:
        present.append("Redis")
    if answers(RABBITMQ):
        present.append("RabbitMQ")
    else:
        missing.append("RabbitMQ ({}:{} does not answer)".format(*RABBITMQ))
    if importlib.util.find_spec("moto") is None:
        missing.append("moto (not installed)")
    else:
        present.append("moto")
    return present, missing


def rows() -> list[str]:
    """The names of the rows a run prints here (tests/test_bench.py)."""
    if importlib.util.find_spec("celery") is None:
        return []
    return [row_name(name, what) for name in references()[0] for what, _ in FIGURES]


def row_name(reference: str, what: str) -> str:
    return f"Celery over the SQS endpoint against {reference}, {what}"


def reference(name: str, runs: Path, stack: contextlib.ExitStack) -> Broker:
    """Celery's producer on broker `name` of `references()`, its server started if need be."""
    from bench.client_tasks import REGION
    from bench.sqs_clients import moto_server

    if name == "Redis":
        return Broker(name, "redis://{}:{}/0".format(*REDIS), {}, runs / "redis")
    if name == "RabbitMQ":
        return Broker(name, "amqp://guest:guest@{}:{}//".format(*RABBITMQ), {}, runs / "rabbitmq")
    moto = stack.enter_context(moto_server()).removeprefix("http://")
    return Broker(name, f"sqs://bench:bench@{moto}", {"region": REGION}, runs / "moto")


def run(bench: Bench) -> None:
    if importlib.util.find_spec("celery") is None:
        print("  (celery_brokers skipped: Celery is not installed)", flush=True)
        return
    from tests.asgi import serve
    from tests.helpers import documented_transport_options

    count = bench.size(full=2000, smoke=20)
    present, missing = references()
    if missing:
        print(f"  (celery_brokers without {', '.join(missing)})", flush=True)
    with contextlib.ExitStack() as stack:
        runs = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        env = {**os.environ, "DATABASE_POOL_SIZE": "8"}
        api, _ = stack.enter_context(serve(env, workers=os.cpu_count() or 1))
        host = api.removesuffix("/api").removeprefix("http://")
        brokers = [
            Broker(
                "the endpoint",
                f"sqs://{AGENT}:{endpoint_secret()}@{host}",
                documented_transport_options(),
                runs / "endpoint",
                empty=reset,
            )
        ]
        stack.callback(brokers[0].close)
        for name in present:
            brokers.append(reference(name, runs, stack))
            stack.callback(brokers[-1].close)
        figures = bench.interleave(
            {broker.name: partial(broker.measure, count) for broker in brokers}
        )
    ours = figures.pop(brokers[0].name)
    for name, theirs in figures.items():
        for index, (what, note) in enumerate(FIGURES):
            bench.add(
                Row(
                    row_name(name, what),
                    [pair[index] for pair in ours],
                    [pair[index] for pair in theirs],
                    f"over {name}",
                    unit="tasks/s",
                    target=TARGETS.get(name),
                    note=note,
                )
            )
