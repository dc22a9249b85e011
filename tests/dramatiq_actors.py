"""The dramatiq project of tests/test_sqs_clients.py, on dramatiq-sqs's broker as on Amazon SQS.

Only where it connects comes from the environment: `SQS_ENDPOINT_URL` and the AWS_* variables.
Each actor run appends a line to the file `DRAMATIQ_RUNS` names ("<actor> <key> <retries>").
`python -m tests.dramatiq_actors N` sends N messages to `count`, one to `flaky` and
one to `doomed`.
"""

from __future__ import annotations

import os
import sys

import dramatiq
from dramatiq.middleware import CurrentMessage
from dramatiq_sqs import SQSBroker

broker = SQSBroker(
    # The failed messages go to `default_dlq`: the agent must be granted it.
    dead_letter=True,
    endpoint_url=os.environ.get("SQS_ENDPOINT_URL"),
    region_name="us-east-1",
)
broker.add_middleware(CurrentMessage())
dramatiq.set_broker(broker)


def record(actor: str, key: object) -> None:
    """One line per run, in one write: lines of concurrent threads never interleave."""
    message = CurrentMessage.get_current_message()
    retries = message.options.get("retries", 0) if message is not None else 0
    with open(os.environ["DRAMATIQ_RUNS"], "a") as runs:
        runs.write(f"{actor} {key} {retries}\n")


@dramatiq.actor
def count(key: int) -> None:
    record("count", key)


@dramatiq.actor(max_retries=3, min_backoff=10, max_backoff=100)
def flaky(key: str) -> None:
    """Fails on its first run; dramatiq's Retries middleware sends it again."""
    message = CurrentMessage.get_current_message()
    record("flaky", key)
    if message is not None and not message.options.get("retries"):
        raise RuntimeError("the first run fails")


@dramatiq.actor(max_retries=0)
def doomed(key: str) -> None:
    """Always fails, with no retry: its message goes to the dead-letter queue."""
    record("doomed", key)
    raise RuntimeError("always fails")


if __name__ == "__main__":
    for key in range(int(sys.argv[1])):
        count.send(key)
    flaky.send("f")
    doomed.send("d")
