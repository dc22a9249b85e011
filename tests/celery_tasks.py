"""The Celery project of tests/test_sqs_clients.py, configured as any Celery project on SQS is.

Only where it connects comes from the environment: `CELERY_BROKER_URL` (`sqs://KEY:SECRET@host:port`,
or `sqs://` with the AWS_* variables). Each task run appends a line to the file `CELERY_RUNS`
names ("<task> <key> <retries>"), which the tests count.
"""

from __future__ import annotations

import os
import time

from celery import Celery, Task
from celery.exceptions import Reject

app = Celery("switchboard_tests")
app.conf.update(
    broker_url=os.environ.get("CELERY_BROKER_URL", "sqs://"),
    # Shorter waits than kombu's defaults (10 s long polls, 1 s between empty polls), so that a
    # worker stops within seconds.
    broker_transport_options={"region": "us-east-1", "wait_time_seconds": 2, "polling_interval": 0},
    broker_connection_retry_on_startup=True,
    task_default_queue="celery",
)


def record(task: str, key: object, retries: int = 0) -> None:
    """One line per run, in one write: lines of concurrent threads never interleave."""
    with open(os.environ["CELERY_RUNS"], "a") as runs:
        runs.write(f"{task} {key} {retries}\n")


@app.task
def add(key: int) -> int:
    record("add", key)
    return key


@app.task(rate_limit="5/s")
def paced(key: int) -> None:
    """Held by the worker until its rate limit lets it run."""
    record("paced", key)


@app.task(acks_late=True)
def hold(key: str, seconds: float) -> None:
    """Acknowledged once done: its message stays received (leased) while it runs."""
    time.sleep(seconds)
    record("hold", key)


@app.task(bind=True, max_retries=3)
def flaky(self: Task, key: str) -> None:
    """Fails on its first run; Celery sends it again, one second later."""
    record("flaky", key, self.request.retries)
    if self.request.retries == 0:
        raise self.retry(countdown=1)


@app.task(acks_late=True)
def refuse(key: str) -> None:
    """Rejected without requeue: left to the queue's redrive policy, as SQS would."""
    record("refuse", key)
    raise Reject("refused", requeue=False)
