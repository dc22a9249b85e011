"""A message sent by Celery or dramatiq over SQS is titled with its task's name."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from django.test import Client

from switchboard_todos.agents import accounts
from switchboard_todos.models import Todo
from switchboard_todos.sqs import messages
from switchboard_todos.sqs.titles import MAX_READ, title_of
from tests.helpers import sqs_post

#: What kombu's SQS transport sends for `add.delay(2)` (Celery's protocol 2), and dramatiq-sqs
#: for `count.send(2)`, less fields that do not matter here.
CELERY = {
    "body": base64.b64encode(b"[[2], {}, {}]").decode(),
    "content-encoding": "utf-8",
    "content-type": "application/json",
    "headers": {"lang": "py", "task": "shop.tasks.add", "id": "5f0c", "retries": 0},
    "properties": {"delivery_mode": 2, "delivery_info": {"routing_key": "celery"}},
}
DRAMATIQ = {
    "queue_name": "default",
    "actor_name": "count",
    "args": [2],
    "kwargs": {},
    "options": {},
    "message_id": "9d1e",
    "message_timestamp": 1700000000000,
}


def encoded(envelope: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(envelope).encode()).decode()


@pytest.mark.parametrize(
    ("body", "title"),
    [
        (encoded(CELERY), "shop.tasks.add"),
        (json.dumps(CELERY), "shop.tasks.add"),  # kombu's sqs_base64_encoding=False
        (encoded(DRAMATIQ), "count"),
        (encoded({**CELERY, "headers": {"task": "x" * 2000}}), "x" * 1000),
        (encoded({"actor_name": "count"}), ""),  # no message id: not dramatiq's
        (encoded({"headers": {"task": 3}}), ""),
        ('{"repo": "api"}', ""),
        ("[1, 2]", ""),
        ("plain text", ""),
        (base64.b64encode(b"\xff\xfe").decode(), ""),
        ("{not json", ""),
        (encoded({**CELERY, "pad": "x" * MAX_READ}), ""),
    ],
)
def test_the_title_is_the_task_a_task_queue_sent(body: str, title: str) -> None:
    assert title_of(body) == title


def test_a_message_sent_over_sqs_keeps_its_body_under_its_title(client: Client, db: None) -> None:
    agent = accounts.create_agent("titled", claim_queues=["celery"], create_queues=["celery"])[0]
    body = encoded(CELERY)
    sent = sqs_post(
        client,
        agent,
        "/sqs/",
        "SendMessage",
        {"QueueUrl": "http://testserver/sqs/celery", "MessageBody": body},
    )
    todo = Todo.objects.get(pk=sent["MessageId"])
    assert (todo.kind, todo.title, messages.body_of(todo)) == ("sqs", "shop.tasks.add", body)
