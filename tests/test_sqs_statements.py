"""What SQS's receive, delete and visibility changes cost the database: one statement each,
which checks the receipt and the agent's credential itself (agents/service/identity.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from switchboard_todos.agents import accounts
from switchboard_todos.models import Agent, State, Todo
from switchboard_todos.sqs.views import CONTENT_TYPE
from tests.helpers import sqs_headers, sqs_post

QUEUE_URL = "http://testserver/sqs/jobs"


@pytest.fixture
def agent(db: None) -> Agent:
    return accounts.create_agent("counted", claim_queues=["jobs"], create_queues=["jobs"])[0]


def send(client: Client, agent: Agent, count: int) -> None:
    for n in range(count):
        params = {"QueueUrl": QUEUE_URL, "MessageBody": f"m{n}"}
        sqs_post(client, agent, "/sqs/", "SendMessage", params)


def receive(client: Client, agent: Agent, count: int = 1) -> list[dict[str, Any]]:
    params = {"QueueUrl": QUEUE_URL, "MaxNumberOfMessages": count}
    messages: list[dict[str, Any]] = sqs_post(client, agent, "/sqs/", "ReceiveMessage", params)[
        "Messages"
    ]
    return messages


def statements(action: Callable[[], object]) -> int:
    with CaptureQueriesContext(connection) as run:
        action()
    return len(run)


def test_a_receive_and_a_delete_are_a_statement_each(client: Client, agent: Agent) -> None:
    """Once the process has read the agent (its first receive), each message received and
    deleted costs two statements: the claim and the complete."""
    send(client, agent, 4)
    assert statements(lambda: receive(client, agent)) == 2  # the agent read, then the claim
    costs = []
    for _ in range(3):
        with CaptureQueriesContext(connection) as receiving:
            [message] = receive(client, agent)
        handle = {"QueueUrl": QUEUE_URL, "ReceiptHandle": message["ReceiptHandle"]}
        with CaptureQueriesContext(connection) as deleting:
            sqs_post(client, agent, "/sqs/", "DeleteMessage", handle)
        costs.append((len(receiving), len(deleting)))
    assert costs == [(1, 1)] * 3
    assert Todo.objects.filter(state=State.DONE).count() == 3


def test_a_batch_is_a_statement_an_entry_and_a_visibility_change_one(
    client: Client, agent: Agent
) -> None:
    send(client, agent, 4)
    received = receive(client, agent, 4)
    assert len(received) == 4
    entries = [
        {"Id": str(n), "ReceiptHandle": message["ReceiptHandle"]}
        for n, message in enumerate(received[:3])
    ]
    batch = {"QueueUrl": QUEUE_URL, "Entries": entries}
    assert statements(lambda: sqs_post(client, agent, "/sqs/", "DeleteMessageBatch", batch)) == 3
    change = {
        "QueueUrl": QUEUE_URL,
        "ReceiptHandle": received[3]["ReceiptHandle"],
        "VisibilityTimeout": 120,
    }
    assert (
        statements(lambda: sqs_post(client, agent, "/sqs/", "ChangeMessageVisibility", change)) == 1
    )
    assert Todo.objects.filter(state=State.DONE).count() == 3


@pytest.mark.parametrize("revoke", [accounts.revoke, accounts.rotate_token])
@pytest.mark.parametrize("action", ["DeleteMessage", "ChangeMessageVisibility", "ReceiveMessage"])
def test_a_revoked_agent_is_refused_at_its_very_next_request(
    client: Client, agent: Agent, revoke: Callable[[Agent], Any], action: str
) -> None:
    """Read by this process a moment before, the agent is revoked (or its key rotated); its next
    request, signed with the secret it had, is refused, and changes nothing."""
    send(client, agent, 2)
    [message] = receive(client, agent)
    as_read = Agent.objects.get(pk=agent.pk)  # signs with the secret it had
    revoke(agent)
    params: dict[str, Any] = {"QueueUrl": QUEUE_URL, "ReceiptHandle": message["ReceiptHandle"]}
    if action == "ChangeMessageVisibility":
        params["VisibilityTimeout"] = 0
    answer = _post_unchecked(client, as_read, action, params)
    assert answer.status_code == 403, answer.content
    assert json.loads(answer.content)["__type"].endswith("#InvalidClientTokenId")
    held = Todo.objects.get(pk=message["MessageId"])
    assert (held.state, held.owner, held.attempt) == (State.CLAIMED, "counted", 1)
    assert Todo.objects.filter(state=State.PENDING).count() == 1


def _post_unchecked(client: Client, agent: Agent, action: str, params: dict[str, Any]) -> Any:
    """`sqs_post`, signed with the secret `agent` had when it was read, answer unchecked."""
    headers = sqs_headers(agent, "http://testserver/sqs/", action, params)
    del headers["Content-Type"]
    return client.post("/sqs/", json.dumps(params), content_type=CONTENT_TYPE, headers=headers)


def test_a_rotated_key_works_at_once(client: Client, agent: Agent) -> None:
    """The process read the agent before its key was rotated: a request signed with the new
    secret is checked against the agent as it is now, and goes through."""
    send(client, agent, 2)
    receive(client, agent)
    accounts.rotate_token(agent)  # `agent` now signs with the new secret
    assert len(receive(client, agent)) == 1
