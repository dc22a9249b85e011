"""A queue's visibility timeout over SQS: the lease of a ReceiveMessage that gives none (as
kombu's, Celery's transport, never does), and what GetQueueAttributes answers."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client

from switchboard_todos.agents import accounts
from switchboard_todos.models import Agent, Queue, Todo
from tests.helpers import sqs_post

QUEUE_URL = "http://testserver/sqs/jobs"


@pytest.fixture
def agent(db: None) -> Agent:
    return accounts.create_agent("leased", claim_queues=["jobs"], create_queues=["jobs"])[0]


def lease_of_a_receive(client: Client, agent: Agent, **params: Any) -> timedelta:
    sqs_post(client, agent, "/sqs/", "SendMessage", {"QueueUrl": QUEUE_URL, "MessageBody": "x"})
    [message] = sqs_post(
        client, agent, "/sqs/", "ReceiveMessage", {"QueueUrl": QUEUE_URL, **params}
    )["Messages"]
    todo = Todo.objects.get(pk=message["MessageId"])
    assert todo.lease_expires_at is not None and todo.claimed_at is not None
    return todo.lease_expires_at - todo.claimed_at


def attributes(client: Client, agent: Agent) -> dict[str, str]:
    answer = sqs_post(
        client,
        agent,
        "/sqs/",
        "GetQueueAttributes",
        {"QueueUrl": QUEUE_URL, "AttributeNames": ["VisibilityTimeout", "RedrivePolicy"]},
    )
    found: dict[str, str] = answer["Attributes"]
    return found


def test_a_receive_without_visibility_timeout_takes_the_queues(
    client: Client, agent: Agent
) -> None:
    Queue.objects.create(name="jobs", visibility_timeout=timedelta(minutes=30), max_attempts=3)
    assert lease_of_a_receive(client, agent) == timedelta(minutes=30)
    assert attributes(client, agent) == {
        "VisibilityTimeout": "1800",
        "RedrivePolicy": json.dumps({"maxReceiveCount": 3, "deadLetterTargetArn": "failed"}),
    }


def test_a_receive_with_visibility_timeout_takes_its_own(client: Client, agent: Agent) -> None:
    Queue.objects.create(name="jobs", visibility_timeout=timedelta(minutes=30))
    assert lease_of_a_receive(client, agent, VisibilityTimeout=45) == timedelta(seconds=45)


def test_without_a_queue_row_the_default_ttl_applies(
    client: Client, agent: Agent, settings: Any
) -> None:
    settings.SWITCHBOARD_TODOS_DEFAULT_TTL = 12
    assert lease_of_a_receive(client, agent) == timedelta(seconds=12)
    assert attributes(client, agent)["VisibilityTimeout"] == "12"
