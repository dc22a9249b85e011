"""Scenario 8: SQS clients (boto3, unmodified), beside the in-process batch paths they stand for.

uvicorn serves the test settings' ASGI application (the SQS endpoint at /sqs/), one process per
CPU. Each agent is a process with its own boto3 client, every request signed with SigV4.

* Send: `send_message_batch` of 10, against `create_many` of 10 in process.
* Drain: 4 consumers `receive_message(MaxNumberOfMessages=10)` + `delete_message_batch`,
  against 4 processes doing `claim_batch(10)` + `complete_many` in process.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

from bench.harness import QUEUE, TTL, Bench, Child, Row, expect_states, plural, reset

AGENTS = 4
BATCH = 10


def client(base: str, credentials: tuple[str, str]) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "sqs",
        endpoint_url=f"{base}/sqs/",
        region_name="us-east-1",
        aws_access_key_id=credentials[0],
        aws_secret_access_key=credentials[1],
        config=Config(retries={"max_attempts": 1}),
    )


def sqs_send(child: Child, *, count: int, base: str, credentials: tuple[str, str]) -> None:
    sqs = client(base, credentials)
    queue = sqs.get_queue_url(QueueName=QUEUE)["QueueUrl"]  # connected before the clock starts
    child.start()
    for first in range(0, count, BATCH):
        numbers = range(first, min(first + BATCH, count))
        entries = [{"Id": str(n), "MessageBody": str(n)} for n in numbers]
        if sqs.send_message_batch(QueueUrl=queue, Entries=entries).get("Failed"):
            raise RuntimeError("a batch entry failed")
        child.count(len(numbers))


def in_process_send(child: Child, *, count: int, **_: Any) -> None:
    from django.db import connection

    from switchboard_todos.models import Todo

    connection.ensure_connection()
    child.start()
    for first in range(0, count, BATCH):
        numbers = range(first, min(first + BATCH, count))
        Todo.objects.create_many(
            {"queue": QUEUE, "kind": "sqs", "payload": {"n": n}} for n in numbers
        )
        child.count(len(numbers))


def sqs_drain(child: Child, *, owner: str, base: str, secrets: dict[str, str]) -> int:
    sqs = client(base, (owner, secrets[owner]))
    queue = sqs.get_queue_url(QueueName=QUEUE)["QueueUrl"]
    child.start()
    done = 0
    while received := sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=BATCH).get(
        "Messages"
    ):
        entries = [
            {"Id": str(n), "ReceiptHandle": message["ReceiptHandle"]}
            for n, message in enumerate(received)
        ]
        if sqs.delete_message_batch(QueueUrl=queue, Entries=entries).get("Failed"):
            raise RuntimeError("a delete failed")
        done += len(received)
        child.count(len(received))
    return done


def in_process_drain(child: Child, *, owner: str, **_: Any) -> int:
    from django.db import connection

    from switchboard_todos.models import Todo

    connection.ensure_connection()
    child.start()
    done = 0
    while todos := Todo.objects.claim_batch(QUEUE, owner, TTL, BATCH):
        Todo.objects.complete_many(owner, {todo.id: None for todo in todos})
        done += len(todos)
        child.count(len(todos))
    return done


def make_agents(names: list[str]) -> dict[str, str]:
    """A fresh agent per name, granted the benchmark's queue; their SQS secrets."""
    from switchboard_todos.agents import accounts
    from switchboard_todos.models import Agent
    from switchboard_todos.sqs.signing import secret_for

    Agent.objects.filter(name__in=names).delete()
    agents = [
        accounts.create_agent(name, claim_queues=[QUEUE], create_queues=[QUEUE])[0]
        for name in names
    ]
    # The sends are measured, not the quota of creations a minute (600 by default).
    Agent.objects.filter(name__in=names).update(max_creates_per_minute=10**9)
    return {agent.name: secret_for(agent) for agent in agents}


def send(bench: Bench, task: Any, count: int, **kwargs: Any) -> float:
    reset()
    seconds, _ = bench.pool.run(task, [{"count": count, **kwargs}], count)
    expect_states({"pending": count}, f"send by {task.__name__}")
    return count / seconds


def run(bench: Bench) -> None:
    agents = min(AGENTS, bench.pool.size)
    secrets = make_agents([f"bench-{index}" for index in range(agents)])
    from tests.asgi import serve

    env = {**os.environ, "DATABASE_POOL_SIZE": str(2 * AGENTS)}
    with serve(env, workers=os.cpu_count() or 1) as (api, _):
        base = api.removesuffix("/api")
        count = bench.size(full=5000, smoke=100)
        credentials = ("bench-0", secrets["bench-0"])
        figures = bench.interleave(
            {
                "sqs": partial(send, bench, sqs_send, count, base=base, credentials=credentials),
                "in-process": partial(send, bench, in_process_send, count),
            }
        )
        bench.add(
            Row(
                f"SQS send_message_batch of {BATCH}, 1 client",
                figures["sqs"],
                figures["in-process"],
                f"in-process create_many of {BATCH}",
                note="boto3, SigV4 on every request",
            )
        )
        backlog = bench.size(full=5000, smoke=100)
        figures = bench.interleave(
            {
                "sqs": partial(bench.drain, sqs_drain, agents, backlog, base=base, secrets=secrets),
                "in-process": partial(bench.drain, in_process_drain, agents, backlog),
            }
        )
        bench.add(
            Row(
                f"SQS receive_message(10) + delete_message_batch, {plural(agents, 'consumer')}",
                figures["sqs"],
                figures["in-process"],
                f"in-process claim_batch({BATCH}) + complete_many",
                note="boto3, one client per consumer process",
            )
        )
