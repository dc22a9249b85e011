"""Celery, dramatiq and aiobotocore, unmodified, on the SQS endpoint of a live uvicorn.

Each is set up as its users set it up for Amazon SQS, with nothing changed but where it
connects (docs/celery.md): a Celery worker (kombu's SQS transport) with `sqs://KEY:SECRET@host:port`
or `sqs://` and AWS_ENDPOINT_URL_SQS, a dramatiq worker on dramatiq-sqs, aiobotocore's async
client. Their runs are lines in a file; their messages are todos, checked in the table.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from switchboard_todos.agents import accounts
from switchboard_todos.models import Queue, State, Todo
from switchboard_todos.sqs.signing import secret_for
from tests import celery_tasks
from tests.asgi import serve
from tests.conftest import ROOT, child_environment
from tests.helpers import wait_until

pytestmark = [pytest.mark.clients, pytest.mark.django_db(transaction=True)]

REGION = "us-east-1"
#: The longest a worker is given to stop after SIGTERM.
STOP_TIMEOUT = 30
#: How long the long-held tasks are held: longer than SWITCHBOARD_TODOS_DEFAULT_TTL (30 s),
#: the lease a receive without VisibilityTimeout got whatever the queue's.
HELD = 36


@pytest.fixture(scope="module")
def base(django_db_setup: None) -> Iterator[str]:
    """uvicorn serving the test settings' application; its base URL."""
    with serve({**child_environment(), "DATABASE_POOL_SIZE": "8"}) as (api, process):
        yield api.removesuffix("/api")
        process.terminate()
        output = process.communicate(timeout=30)[0]
    assert "Traceback" not in output, output


def grant(name: str, queues: list[str], *, create: list[str] | None = None) -> dict[str, str]:
    """A new agent claiming from and creating in `queues` (and creating in `create`); its
    credentials as the AWS_* variables."""
    agent = accounts.create_agent(
        name, claim_queues=queues, create_queues=[*queues, *(create or [])]
    )[0]
    return {"AWS_ACCESS_KEY_ID": agent.name, "AWS_SECRET_ACCESS_KEY": secret_for(agent)}


class Runs:
    """The lines the tasks append to a file, one per run: (task, key, retries)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def all(self) -> list[tuple[str, str, int]]:
        if not self.path.exists():
            return []
        lines = self.path.read_text().splitlines()
        return [(task, key, int(retries)) for task, key, retries in map(str.split, lines)]

    def of(self, task: str) -> list[tuple[str, int]]:
        return [(key, retries) for name, key, retries in self.all() if name == task]


@pytest.fixture
def runs(tmp_path: Path) -> Runs:
    return Runs(tmp_path / "runs")


class Child:
    """A process a test started, and the file its output goes to."""

    def __init__(self, process: subprocess.Popen[str], log: Path) -> None:
        self.process = process
        self.log = log

    def output(self) -> str:
        return self.log.read_text()


Start = Callable[..., Child]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """Start `python -m <args>` with the test database's environment and `env`, its output
    in a file; stopped as an operator stops it (SIGTERM) after the test."""
    started: list[Child] = []

    def start(*args: str, env: dict[str, str]) -> Child:
        log = tmp_path / f"{args[0]}-{len(started)}.log"
        with log.open("w") as output:
            process = subprocess.Popen(
                [sys.executable, "-m", *args],
                cwd=ROOT,
                env={**child_environment(), **env},
                stdout=output,
                stderr=subprocess.STDOUT,
                text=True,
            )
        started.append(Child(process, log))
        return started[-1]

    yield start
    for child in started:
        child.process.send_signal(signal.SIGTERM)
    for child in started:
        try:
            child.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()
            pytest.fail(f"{child.process.args!r} did not stop within {STOP_TIMEOUT}s of SIGTERM")


def states(queue: str) -> list[tuple[str, int]]:
    """(state, attempt) of each todo of `queue`, oldest first."""
    return list(
        Todo.objects.filter(queue=queue).order_by("created_at").values_list("state", "attempt")
    )


def all_done(queue: str, count: int) -> bool:
    return Todo.objects.filter(queue=queue, state=State.DONE).count() == count


# Celery


@pytest.fixture(scope="module")
def host(base: str) -> str:
    return base.removeprefix("http://")


@pytest.fixture
def producer(host: str) -> Iterator[Callable[[dict[str, str]], None]]:
    """Point this process's Celery app (the producer's) at the endpoint, as the agent."""

    def connect(credentials: dict[str, str]) -> None:
        key, secret = credentials["AWS_ACCESS_KEY_ID"], credentials["AWS_SECRET_ACCESS_KEY"]
        celery_tasks.app.conf.broker_url = f"sqs://{key}:{secret}@{host}"

    yield connect
    # Its connections and producers, signed with this test's agent's secret, which dies with
    # the agent: the next test's agent has another.
    celery_tasks.app.pool.force_close_all()
    celery_tasks.app.amqp._producer_pool = None
    celery_tasks.app.close()


def celery_worker(start: Start, runs: Runs, env: dict[str, str], *queues: str) -> Child:
    return start(
        "celery",
        "--app",
        "tests.celery_tasks",
        "worker",
        "--pool",
        "threads",
        "--concurrency",
        "4",
        "--queues",
        ",".join(queues or ["celery"]),
        "--loglevel",
        "INFO",
        env={**env, "CELERY_RUNS": str(runs.path)},
    )


def test_celery_runs_tasks_sent_with_delay_once_each(
    host: str, start: Start, runs: Runs, producer: Any
) -> None:
    credentials = grant("celery-bot", ["celery"])
    key, secret = credentials["AWS_ACCESS_KEY_ID"], credentials["AWS_SECRET_ACCESS_KEY"]
    worker = celery_worker(start, runs, {"CELERY_BROKER_URL": f"sqs://{key}:{secret}@{host}"})
    producer(credentials)
    for key_ in range(50):
        celery_tasks.add.delay(key_)
    for key_ in range(5):
        celery_tasks.paced.delay(key_)  # Celery's own rate limit, 5 a second
    wait_until(lambda: all_done("celery", 55), "55 tasks done", timeout=60)
    assert sorted(int(key_) for key_, _ in runs.of("add")) == list(range(50))
    assert sorted(int(key_) for key_, _ in runs.of("paced")) == list(range(5))
    assert states("celery") == [(State.DONE, 1)] * 55
    titles = set(Todo.objects.values_list("kind", "title"))
    assert titles == {("sqs", "tests.celery_tasks.add"), ("sqs", "tests.celery_tasks.paced")}
    assert "ERROR" not in worker.output()


@pytest.fixture
def reaper(start: Start) -> Child:
    """`reap_todos --loop`, as every deployment runs it, sweeping every second."""
    return start("django", "reap_todos", "--loop", "--interval", "1", env={})


def test_celery_work_held_past_the_default_lease_runs_once(
    host: str,
    start: Start,
    runs: Runs,
    producer: Any,
    reaper: Child,
) -> None:
    """kombu never sends VisibilityTimeout: its receives take the queue's, which the operator
    set longer than a countdown and an acks_late task (each longer than 30 s, the default)."""
    Queue.objects.update_or_create(
        name="celery", defaults={"visibility_timeout": timedelta(seconds=90)}
    )
    credentials = grant("celery-held", ["celery"])
    key, secret = credentials["AWS_ACCESS_KEY_ID"], credentials["AWS_SECRET_ACCESS_KEY"]
    worker = celery_worker(start, runs, {"CELERY_BROKER_URL": f"sqs://{key}:{secret}@{host}"})
    producer(credentials)
    celery_tasks.add.apply_async((1,), countdown=HELD)
    celery_tasks.hold.delay("late", HELD)
    wait_until(lambda: all_done("celery", 2), "both tasks done", timeout=HELD + 30)
    assert sorted(runs.all()) == [("add", "1", 0), ("hold", "late", 0)]
    assert states("celery") == [(State.DONE, 1), (State.DONE, 1)]
    assert "ERROR" not in worker.output()


def test_celery_retries_and_rejects_over_an_endpoint_url(
    base: str,
    start: Start,
    runs: Runs,
    producer: Any,
    reaper: Child,
    admin_client: Client,
) -> None:
    """`broker_url="sqs://"` with AWS_ENDPOINT_URL_SQS at /sqs/: a task that raises is sent
    again by Celery; a rejected one is received until the redrive policy's count and ends a
    dead letter, listed in the admin under its task's name."""
    Queue.objects.update_or_create(
        name="doomed", defaults={"visibility_timeout": timedelta(seconds=1)}
    )
    credentials = grant("celery-retries", ["celery", "doomed"])
    endpoint = {"CELERY_BROKER_URL": "sqs://", "AWS_ENDPOINT_URL_SQS": f"{base}/sqs/"}
    celery_worker(start, runs, {**credentials, **endpoint}, "celery", "doomed")
    producer(credentials)
    celery_tasks.flaky.delay("f")
    celery_tasks.refuse.apply_async(("r",), queue="doomed")
    wait_until(lambda: all_done("celery", 2), "the task and its retry done", timeout=60)
    assert runs.of("flaky") == [("f", 0), ("f", 1)]
    assert states("celery") == [(State.DONE, 1), (State.DONE, 1)]
    wait_until(
        lambda: Todo.objects.filter(queue="doomed", state=State.FAILED).exists(),
        "the rejected task dead-lettered",
        timeout=60,
    )
    assert runs.of("refuse") == [("r", 0)] * 5
    assert states("doomed") == [(State.FAILED, 5)]
    page = admin_client.get("/admin/switchboard_todos/todo/?state__exact=failed").content.decode()
    assert "tests.celery_tasks.refuse" in page


def test_celery_remote_control_and_purge_fail_with_a_clear_message(host: str) -> None:
    """`celery inspect` needs reply queues of its own, `celery purge` is an operator's action:
    both stop at once, saying so."""
    credentials = grant("celery-control", ["celery"])
    key, secret = credentials["AWS_ACCESS_KEY_ID"], credentials["AWS_SECRET_ACCESS_KEY"]
    env = {**child_environment(), "CELERY_BROKER_URL": f"sqs://{key}:{secret}@{host}"}

    def celery(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "celery", "--app", "tests.celery_tasks", *args]
        return subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )

    inspect = celery("inspect", "ping")
    assert inspect.returncode != 0
    assert (
        "Celery's remote control, `celery inspect` and `celery control`"
        in inspect.stdout + inspect.stderr
    )
    purge = celery("purge", "--force")
    assert purge.returncode != 0
    assert "PurgeQueue is an operator's action" in purge.stderr


# dramatiq


def test_dramatiq_runs_fifty_messages_a_retry_and_a_dead_letter(
    base: str, start: Start, tmp_path: Path
) -> None:
    """dramatiq-sqs with `dead_letter=True`: its `default_dlq` is a queue granted to the agent,
    where a message that failed for good is sent (and deleted from `default`), as on SQS."""
    credentials = grant("dramatiq-bot", ["default"], create=["default_dlq"])
    runs = Runs(tmp_path / "runs")
    env = {**credentials, "SQS_ENDPOINT_URL": f"{base}/sqs/", "DRAMATIQ_RUNS": str(runs.path)}
    worker = start(
        "dramatiq", "tests.dramatiq_actors", "--processes", "1", "--threads", "4", env=env
    )
    sender = subprocess.run(
        [sys.executable, "-m", "tests.dramatiq_actors", "50"],
        cwd=ROOT,
        env={**child_environment(), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sender.returncode == 0, sender.stderr
    wait_until(lambda: all_done("default", 53), "every message done", timeout=60)
    assert sorted(int(key) for key, _ in runs.of("count")) == list(range(50))
    assert runs.of("flaky") == [("f", 0), ("f", 1)]
    assert runs.of("doomed") == [("d", 0)]
    assert states("default") == [(State.DONE, 1)] * 53
    [dead] = Todo.objects.filter(queue="default_dlq")
    assert (dead.state, dead.title) == (State.PENDING, "doomed")
    assert "Traceback" in worker.output()  # the two failures, logged by dramatiq


# aiobotocore


def test_aiobotocore_sends_receives_and_deletes_in_batches(base: str) -> None:
    from aiobotocore.session import get_session

    credentials = grant("async-bot", ["jobs"])

    async def work() -> list[str]:
        session = get_session()
        async with session.create_client(
            "sqs",
            endpoint_url=f"{base}/sqs/",
            region_name=REGION,
            aws_access_key_id=credentials["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=credentials["AWS_SECRET_ACCESS_KEY"],
        ) as sqs:
            queue = (await sqs.get_queue_url(QueueName="jobs"))["QueueUrl"]
            await sqs.send_message(QueueUrl=queue, MessageBody="one")
            sent = await sqs.send_message_batch(
                QueueUrl=queue,
                Entries=[{"Id": str(n), "MessageBody": f"batch {n}"} for n in range(3)],
            )
            assert not sent.get("Failed")
            received = (
                await sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1)
            )["Messages"]
            handles = {message["Body"]: message["ReceiptHandle"] for message in received}
            await sqs.delete_message(QueueUrl=queue, ReceiptHandle=handles.pop("one"))
            released = await sqs.change_message_visibility_batch(
                QueueUrl=queue,
                Entries=[
                    {"Id": "0", "ReceiptHandle": handles.pop("batch 0"), "VisibilityTimeout": 0}
                ],
            )
            assert not released.get("Failed")
            deleted = await sqs.delete_message_batch(
                QueueUrl=queue,
                Entries=[
                    {"Id": str(n), "ReceiptHandle": handle}
                    for n, handle in enumerate(handles.values())
                ],
            )
            assert not deleted.get("Failed")
            again = await sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1)
            return [message["Body"] for message in again["Messages"]]

    assert asyncio.run(work()) == ["batch 0"]
    # A message released with VisibilityTimeout 0 is not charged the receive (SQS counts it).
    assert sorted(states("jobs")) == [(State.CLAIMED, 1)] + [(State.DONE, 1)] * 3
