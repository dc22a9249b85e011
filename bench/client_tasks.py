"""The task Celery and dramatiq run in bench/sqs_clients.py (and Celery in celery_brokers.py).

`tick` appends two bytes to the file BENCH_RUNS names: the benchmark counts runs by its size.
The workers load `celery` (`celery --app bench.client_tasks:celery worker`) and `broker`
(`dramatiq bench.client_tasks:broker`), connected where CELERY_BROKER_URL and
SQS_ENDPOINT_URL say, with the Celery transport options BENCH_TRANSPORT_OPTIONS gives in JSON
(bench/celery_brokers.py: each broker's own); the benchmark's own process makes a producer per
side with `celery_tick` and `dramatiq_tick`.
"""

from __future__ import annotations

import json
import os
from typing import Any

import dramatiq
from celery import Celery
from dramatiq_sqs import SQSBroker

#: The queue of each client (the benchmark's agent is granted both): a worker of one would
#: take the other's messages for ill-formed ones.
CELERY_QUEUE = "bench-celery"
DRAMATIQ_QUEUE = "bench-dramatiq"
REGION = "us-east-1"
#: kombu's defaults but for shorter long polls, so that a worker stops within seconds.
SHORT_POLLS = {"region": REGION, "wait_time_seconds": 2}


def tick() -> None:
    with open(os.environ["BENCH_RUNS"], "ab") as runs:
        runs.write(b".\n")


def celery_tick(broker_url: str, transport_options: dict[str, Any] | None = None) -> Any:
    """`tick` as a task of a Celery app on `broker_url`, with `transport_options` (by default
    SHORT_POLLS)."""
    app = Celery("bench", broker=broker_url)
    app.conf.update(
        task_default_queue=CELERY_QUEUE,
        broker_transport_options=SHORT_POLLS if transport_options is None else transport_options,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    return app.task(name="bench.tick")(tick)


def dramatiq_tick(
    endpoint_url: str | None, key: str | None = None, secret: str | None = None
) -> Any:
    """`tick` as an actor of a dramatiq-sqs broker at `endpoint_url` (as `key`, else as the
    AWS_* variables say)."""
    sqs = SQSBroker(
        endpoint_url=endpoint_url,
        region_name=REGION,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
    )
    return dramatiq.actor(broker=sqs, queue_name=DRAMATIQ_QUEUE, actor_name="tick")(tick)


celery = celery_tick(
    os.environ.get("CELERY_BROKER_URL", "sqs://"),
    json.loads(os.environ["BENCH_TRANSPORT_OPTIONS"])
    if "BENCH_TRANSPORT_OPTIONS" in os.environ
    else None,
)._get_app()
broker = dramatiq_tick(os.environ.get("SQS_ENDPOINT_URL")).broker
