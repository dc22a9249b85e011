"""The SQS endpoint, served by a real ASGI server, driven by boto3 with only `endpoint_url` set."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import boto3
import httpx
import pytest
from asgiref.sync import async_to_sync
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from django.core.management import call_command
from django.db import connections
from django.http import HttpRequest

from switchboard_todos.agents import accounts
from switchboard_todos.claims import long_polls
from switchboard_todos.models import Agent, State, Todo
from switchboard_todos.sqs import messages, views
from switchboard_todos.sqs.signing import secret_for
from tests.asgi import serve
from tests.conftest import run_in_threads
from tests.helpers import sqs_headers, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Client = Any  # boto3's SQS client is generated at run time


@pytest.fixture
def server(subprocess_env: dict[str, str]) -> Iterator[str]:
    with serve({**subprocess_env, "DATABASE_POOL_SIZE": "8"}) as (api, process):
        yield api.removesuffix("/api")
        process.terminate()
        output = process.communicate(timeout=30)[0]
    assert "Traceback" not in output, output


@pytest.fixture
def connect(server: str) -> Callable[..., Client]:
    """A boto3 SQS client for an agent (its derived secret, unless another is given)."""

    def client(agent: Agent, secret: str | None = None) -> Client:
        return boto3.client(
            "sqs",
            endpoint_url=f"{server}/sqs/",
            region_name="us-east-1",
            aws_access_key_id=agent.name,
            aws_secret_access_key=secret or secret_for(agent),
            config=Config(retries={"max_attempts": 1}, read_timeout=60),
        )

    return client


@pytest.fixture
def agent() -> Agent:
    return accounts.create_agent("sqs-bot", claim_queues=["jobs"], create_queues=["jobs"])[0]


def url(sqs: Client, queue: str = "jobs") -> str:
    return str(sqs.get_queue_url(QueueName=queue)["QueueUrl"])


def code(error: pytest.ExceptionInfo[ClientError]) -> str:
    return str(error.value.response["Error"]["Code"])


def test_send_receive_delete_with_attributes(connect: Callable[..., Client], agent: Agent) -> None:
    sqs = connect(agent)
    queue = url(sqs)
    assert queue.endswith("/sqs/jobs")
    assert sqs.list_queues()["QueueUrls"] == [queue]
    attributes = {
        "colour": {"DataType": "String", "StringValue": "blue"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xff"},
    }
    sent = sqs.send_message(
        QueueUrl=queue, MessageBody='{"n": 1} ünïcode', MessageAttributes=attributes
    )
    assert sent["MD5OfMessageBody"] == messages.md5_of_body('{"n": 1} ünïcode')
    [message] = sqs.receive_message(
        QueueUrl=queue,
        MaxNumberOfMessages=10,
        MessageAttributeNames=["All"],
        MessageSystemAttributeNames=["All"],
    )["Messages"]
    assert (message["MessageId"], message["Body"]) == (sent["MessageId"], '{"n": 1} ünïcode')
    assert message["MessageAttributes"]["blob"]["BinaryValue"] == b"\x00\xff"
    assert message["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert message["Attributes"]["ApproximateReceiveCount"] == "1"
    todo = Todo.objects.get(pk=sent["MessageId"])
    assert (todo.state, todo.owner, todo.source) == (State.CLAIMED, "sqs-bot", "agent:sqs-bot")
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
    assert Todo.objects.get(pk=todo.pk).state == State.DONE
    attributes_now = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])
    assert attributes_now["Attributes"]["ApproximateNumberOfMessages"] == "0"


def test_batches_report_each_entry(connect: Callable[..., Client], agent: Agent) -> None:
    sqs = connect(agent)
    queue = url(sqs)
    sent = sqs.send_message_batch(
        QueueUrl=queue,
        Entries=[
            {"Id": "a", "MessageBody": "one"},
            {"Id": "b", "MessageBody": "two", "DelaySeconds": 1000},
            {"Id": "c", "MessageBody": "three"},
        ],
    )
    assert sorted(entry["Id"] for entry in sent["Successful"]) == ["a", "c"]
    assert [(entry["Id"], entry["Code"]) for entry in sent["Failed"]] == [
        ("b", "InvalidParameterValue")
    ]
    received = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]
    assert sorted(message["Body"] for message in received) == ["one", "three"]
    deleted = sqs.delete_message_batch(
        QueueUrl=queue,
        Entries=[
            {"Id": "x", "ReceiptHandle": received[0]["ReceiptHandle"]},
            {"Id": "y", "ReceiptHandle": "not-a-handle"},
        ],
    )
    assert [entry["Id"] for entry in deleted["Successful"]] == ["x"]
    assert [(entry["Id"], entry["Code"]) for entry in deleted["Failed"]] == [
        ("y", "ReceiptHandleIsInvalid")
    ]
    with pytest.raises(ClientError) as error:
        sqs.send_message_batch(
            QueueUrl=queue, Entries=[{"Id": str(n), "MessageBody": "x"} for n in range(11)]
        )
    assert code(error) == "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"


def test_a_long_poll_answers_as_soon_as_a_message_is_sent(
    connect: Callable[..., Client], agent: Agent
) -> None:
    sqs = connect(agent)
    queue = url(sqs)

    def send_later() -> None:
        time.sleep(0.5)
        try:
            Todo.objects.create_todo(queue="jobs", kind=messages.KIND, payload={"body": "late"})
        finally:
            connections.close_all()

    sender = threading.Thread(target=send_later)
    started = time.monotonic()
    sender.start()
    received = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=20)["Messages"]
    elapsed = time.monotonic() - started
    sender.join()
    assert [message["Body"] for message in received] == ["late"]
    assert elapsed < 10, elapsed


def test_a_lapsed_message_comes_back_and_the_old_receipt_is_stale(
    connect: Callable[..., Client], agent: Agent
) -> None:
    sqs = connect(agent)
    queue = url(sqs)
    sqs.send_message(QueueUrl=queue, MessageBody="again")
    [first] = sqs.receive_message(QueueUrl=queue)["Messages"]
    Todo.objects.expire_lease(first["MessageId"])  # the lease lapses, by the database's clock
    Todo.objects.reap_expired()
    [second] = sqs.receive_message(QueueUrl=queue, MessageSystemAttributeNames=["All"])["Messages"]
    assert second["MessageId"] == first["MessageId"]
    assert second["Attributes"]["ApproximateReceiveCount"] == "2"
    with pytest.raises(ClientError) as error:
        sqs.delete_message(QueueUrl=queue, ReceiptHandle=first["ReceiptHandle"])
    assert code(error) == "ReceiptHandleIsInvalid"
    assert Todo.objects.get(pk=second["MessageId"]).state == State.CLAIMED
    sqs.change_message_visibility(
        QueueUrl=queue, ReceiptHandle=second["ReceiptHandle"], VisibilityTimeout=0
    )
    [third] = sqs.receive_message(QueueUrl=queue)["Messages"]
    assert third["MessageId"] == first["MessageId"]


def test_a_cancelled_message_is_not_inflight(connect: Callable[..., Client], agent: Agent) -> None:
    """Once an operator cancels a received message, changing its visibility (single, batch, or
    to zero) and deleting it answer MessageNotInflight, and change nothing."""
    sqs = connect(agent)
    queue = url(sqs)
    sqs.send_message(QueueUrl=queue, MessageBody="long job")
    [message] = sqs.receive_message(QueueUrl=queue)["Messages"]
    handle = message["ReceiptHandle"]
    Todo.objects.cancel(message["MessageId"], "wrong customer")
    calls: list[tuple[str, dict[str, Any]]] = [
        ("change_message_visibility", {"VisibilityTimeout": 60}),
        ("change_message_visibility", {"VisibilityTimeout": 0}),
        ("delete_message", {}),
    ]
    for action, arguments in calls:
        with pytest.raises(ClientError) as error:
            getattr(sqs, action)(QueueUrl=queue, ReceiptHandle=handle, **arguments)
        assert code(error) == "MessageNotInflight"
        assert "cancelled by an operator" in error.value.response["Error"]["Message"]
    entries = [{"Id": "m", "ReceiptHandle": handle, "VisibilityTimeout": 60}]
    changed = sqs.change_message_visibility_batch(QueueUrl=queue, Entries=entries)
    deleted = sqs.delete_message_batch(
        QueueUrl=queue, Entries=[{"Id": "m", "ReceiptHandle": handle}]
    )
    for answer in (changed, deleted):
        assert [(entry["Id"], entry["Code"]) for entry in answer["Failed"]] == [
            ("m", "MessageNotInflight")
        ]
    row = Todo.objects.get(pk=message["MessageId"])
    assert (row.state, row.result) == (
        State.FAILED,
        {"type": "Cancelled", "message": "wrong customer"},
    )


def test_deduplication_ids_and_dead_letters(connect: Callable[..., Client], agent: Agent) -> None:
    sqs = connect(agent)
    queue = url(sqs)
    first = sqs.send_message(QueueUrl=queue, MessageBody="x", MessageDeduplicationId="d-1")
    again = sqs.send_message(QueueUrl=queue, MessageBody="x", MessageDeduplicationId="d-1")
    assert first["MessageId"] == again["MessageId"]
    Todo.objects.filter(pk=first["MessageId"]).update(max_attempts=1)
    sqs.receive_message(QueueUrl=queue)
    Todo.objects.expire_lease(first["MessageId"])
    Todo.objects.reap_expired()
    assert Todo.objects.get(pk=first["MessageId"]).state == State.FAILED
    assert sqs.receive_message(QueueUrl=queue).get("Messages", []) == []


def test_message_groups_take_turns_as_in_sqs_fair_queues(
    connect: Callable[..., Client], agent: Agent
) -> None:
    """A MessageGroupId is the message's tenant, the agent's own: a quiet group's message is
    received ahead of another group's backlog, and comes back with its group."""
    sqs = connect(agent)
    queue = url(sqs)
    for batch in range(3):
        entries = [
            {"Id": str(n), "MessageBody": f"row {batch}-{n}", "MessageGroupId": "import"}
            for n in range(10)
        ]
        assert not sqs.send_message_batch(QueueUrl=queue, Entries=entries).get("Failed")
    quiet = sqs.send_message(QueueUrl=queue, MessageBody="one", MessageGroupId="customer-42")
    assert Todo.objects.get(pk=quiet["MessageId"]).fair_key == "agent:sqs-bot/customer-42"
    received = sqs.receive_message(
        QueueUrl=queue, MaxNumberOfMessages=2, AttributeNames=["MessageGroupId"]
    )["Messages"]
    groups = {message["MessageId"]: message["Attributes"]["MessageGroupId"] for message in received}
    assert groups[quiet["MessageId"]] == "customer-42"
    assert sorted(groups.values()) == ["customer-42", "import"]
    plain = sqs.send_message(QueueUrl=queue, MessageBody="no group")
    assert Todo.objects.get(pk=plain["MessageId"]).fair_key == "agent:sqs-bot"
    with pytest.raises(ClientError) as refused:
        sqs.send_message(QueueUrl=queue, MessageBody="x", MessageGroupId="has space")
    assert code(refused) == "InvalidParameterValue"


def test_credentials_and_grants_are_checked(connect: Callable[..., Client], agent: Agent) -> None:
    with pytest.raises(ClientError) as error:
        connect(agent, secret="x" * 40).list_queues()
    assert code(error) == "SignatureDoesNotMatch"
    stranger = Agent(name="nobody", token_generation=1)
    with pytest.raises(ClientError) as error:
        connect(stranger).list_queues()
    assert code(error) == "InvalidClientTokenId"
    sqs = connect(agent)
    with pytest.raises(ClientError) as error:
        sqs.send_message(QueueUrl=url(sqs).replace("/jobs", "/secret"), MessageBody="x")
    assert code(error) == "AccessDenied"
    with pytest.raises(ClientError) as error:
        sqs.create_queue(QueueName="new")
    assert code(error) == "AWS.SimpleQueueService.UnsupportedOperation"
    with pytest.raises(ClientError) as error:
        sqs.purge_queue(QueueUrl=url(sqs))
    assert code(error) == "AccessDenied"
    accounts.rotate_token(agent)
    with pytest.raises(ClientError) as error:
        sqs.list_queues()  # the old secret died with the old token
    assert code(error) == "SignatureDoesNotMatch"
    assert Todo.objects.count() == 0


def test_sqs_credentials_prints_two_shell_lines(agent: Agent) -> None:
    out = StringIO()
    call_command("todo_agent", "sqs-credentials", "sqs-bot", stdout=out)
    assert out.getvalue().splitlines() == [
        "AWS_ACCESS_KEY_ID=sqs-bot",
        f"AWS_SECRET_ACCESS_KEY={secret_for(agent)}",
    ]


def test_four_consumer_threads_drain_two_thousand_messages_once(
    connect: Callable[..., Client], agent: Agent
) -> None:
    """The consumer loop of SQS's documentation: receive up to 10, process, delete in batch."""
    Agent.objects.filter(pk=agent.pk).update(  # the default is 600, 60 at once
        max_creates_per_minute=2000, burst_seconds=60
    )
    sqs = connect(agent)
    queue = url(sqs)
    for start in range(0, 2000, 10):
        entries = [{"Id": str(n), "MessageBody": str(start + n)} for n in range(10)]
        assert not sqs.send_message_batch(QueueUrl=queue, Entries=entries).get("Failed")

    def consume(index: int) -> list[str]:
        own = connect(agent)
        bodies: list[str] = []
        while received := own.receive_message(
            QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1
        ).get("Messages"):
            bodies += [message["Body"] for message in received]
            entries = [
                {"Id": str(n), "ReceiptHandle": message["ReceiptHandle"]}
                for n, message in enumerate(received)
            ]
            assert not own.delete_message_batch(QueueUrl=queue, Entries=entries).get("Failed")
        return bodies

    bodies = [body for part in run_in_threads(4, consume) for body in part]
    assert sorted(bodies, key=int) == [str(n) for n in range(2000)]
    assert set(Todo.objects.values_list("state", "attempt")) == {(State.DONE, 1)}


def test_the_aws_cli_sends_receives_and_deletes(server: str, agent: Agent) -> None:
    """`aws sqs …` with --endpoint-url, as an operator would script it."""
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": agent.name,
        "AWS_SECRET_ACCESS_KEY": secret_for(agent),
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }

    def aws(*args: str) -> Any:
        command = [sys.executable, "-m", "awscli", "sqs", *args, "--endpoint-url", f"{server}/sqs/"]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout) if done.stdout.strip() else None

    queue = aws("get-queue-url", "--queue-name", "jobs")["QueueUrl"]
    sent = aws("send-message", "--queue-url", queue, "--message-body", "from the cli")
    [message] = aws("receive-message", "--queue-url", queue)["Messages"]
    assert (message["MessageId"], message["Body"]) == (sent["MessageId"], "from the cli")
    aws("delete-message", "--queue-url", queue, "--receipt-handle", message["ReceiptHandle"])
    assert Todo.objects.get(pk=sent["MessageId"]).state == State.DONE


# What one agent may take (issue 24 §2): botocore sees SQS's throttling error


def test_a_receive_at_the_held_quota_is_throttled_and_claims_nothing(
    connect: Callable[..., Client], agent: Agent
) -> None:
    Agent.objects.filter(pk=agent.pk).update(max_held=2)
    for n in range(3):
        Todo.objects.create_todo(queue="jobs", kind="k", payload={"n": n})
    connections.close_all()
    sqs = connect(agent)
    queue = url(sqs)
    assert len(sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]) == 2
    started = time.monotonic()
    with pytest.raises(ClientError) as throttled:
        sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=20)
    assert time.monotonic() - started < 5  # at once, not after the long poll
    assert code(throttled) == "RequestThrottled"
    assert "holds 2 todos" in throttled.value.response["Error"]["Message"]
    assert Todo.objects.filter(state=State.PENDING).count() == 1


def test_sends_past_the_minute_quota_are_throttled_each_batch_entry_counted(
    connect: Callable[..., Client], agent: Agent
) -> None:
    Agent.objects.filter(pk=agent.pk).update(max_creates_per_minute=4, burst_seconds=60)
    connections.close_all()
    sqs = connect(agent)
    queue = url(sqs)
    sent = sqs.send_message_batch(
        QueueUrl=queue, Entries=[{"Id": str(n), "MessageBody": f"m{n}"} for n in range(6)]
    )
    assert sorted(entry["Id"] for entry in sent["Successful"]) == ["0", "1", "2", "3"]
    assert [(entry["Id"], entry["Code"]) for entry in sent["Failed"]] == [
        ("4", "RequestThrottled"),
        ("5", "RequestThrottled"),
    ]
    with pytest.raises(ClientError) as throttled:
        sqs.send_message(QueueUrl=queue, MessageBody="one more")
    assert code(throttled) == "RequestThrottled"
    assert Todo.objects.filter(queue="jobs").count() == 4


def test_a_deduplication_id_is_the_agents_own(connect: Callable[..., Client], agent: Agent) -> None:
    """A producer's todo holding the same key is neither returned nor blocks the send."""
    secret, _ = Todo.objects.create_todo(queue="jobs", kind="k", idempotency_key="d-1")
    connections.close_all()
    sqs = connect(agent)
    queue = url(sqs)
    first = sqs.send_message(QueueUrl=queue, MessageBody="a", MessageDeduplicationId="d-1")
    again = sqs.send_message(QueueUrl=queue, MessageBody="a", MessageDeduplicationId="d-1")
    assert first["MessageId"] == again["MessageId"] != secret.id


def signed(
    server: str,
    agent: Agent,
    action: str,
    params: dict[str, Any],
    *,
    secret: str | None = None,
    sign_target: bool = True,
) -> httpx.Response:
    """One request signed by botocore's SigV4 signer as a client would, sent as it is: any
    parameters, past boto3's own checks. `sign_target=False` signs it before X-Amz-Target is
    added (over host, content type and date only)."""
    body = json.dumps(params).encode()
    target = {"X-Amz-Target": f"AmazonSQS.{action}"}
    request = AWSRequest(
        method="POST",
        url=f"{server}/sqs/",
        data=body,
        headers={"Content-Type": "application/x-amz-json-1.0", **(target if sign_target else {})},
    )
    credentials = Credentials(agent.name, secret or secret_for(agent))
    signer: Any = SigV4Auth(credentials, "sqs", "us-east-1")
    signer.add_auth(request)
    return httpx.post(request.url, content=body, headers={**dict(request.headers), **target})


def error_code(response: httpx.Response) -> str:
    return str(response.json()["__type"]).rsplit("#", 1)[-1]


@pytest.mark.parametrize(
    "attributes",
    [
        {"a": {"DataType": "String"}},
        {"a": {"DataType": "String", "StringValue": 5}},
        {"a": {"DataType": "Binary", "BinaryValue": "not base64!"}},
        {"a": {"DataType": "Number", "StringValue": "many"}},
        {"a": {"DataType": "Date", "StringValue": "today"}},
        {"a": "blue"},
        {"AWS.a": {"DataType": "String", "StringValue": "x"}},
        {"a..b": {"DataType": "String", "StringValue": "x"}},
        {str(n): {"DataType": "String", "StringValue": "x"} for n in range(11)},
        ["a"],
    ],
)
def test_a_malformed_attribute_is_refused_before_anything_is_written(
    server: str, connect: Callable[..., Client], agent: Agent, attributes: Any
) -> None:
    """Before, the todo was committed, then the answer failed (500; a retry made a second
    one), and every later receive of the queue failed after claiming."""
    sqs = connect(agent)
    queue = url(sqs)
    message = {"QueueUrl": queue, "MessageBody": "x", "MessageAttributes": attributes}
    for action, params in [
        ("SendMessage", message),
        ("SendMessageBatch", {"QueueUrl": queue, "Entries": [{"Id": "1", **message}]}),
    ]:
        response = signed(server, agent, action, params)
        if action == "SendMessage":
            assert response.status_code == 400, response.text
            assert error_code(response) == "InvalidParameterValue"
        else:
            assert response.status_code == 200, response.text
            assert [entry["Code"] for entry in response.json()["Failed"]] == [
                "InvalidParameterValue"
            ]
    assert Todo.objects.count() == 0
    sent = sqs.send_message(QueueUrl=queue, MessageBody="fine")
    [received] = sqs.receive_message(QueueUrl=queue, MessageSystemAttributeNames=["All"])[
        "Messages"
    ]
    assert received["MessageId"] == sent["MessageId"]
    assert received["Attributes"]["ApproximateReceiveCount"] == "1"


@pytest.mark.parametrize("names", [5, "All", [1], {"All": True}])
def test_a_receive_with_malformed_names_claims_nothing(
    server: str, connect: Callable[..., Client], agent: Agent, names: Any
) -> None:
    sqs = connect(agent)
    queue = url(sqs)
    sqs.send_message(QueueUrl=queue, MessageBody="waiting")
    for name in ["AttributeNames", "MessageSystemAttributeNames", "MessageAttributeNames"]:
        response = signed(
            server,
            agent,
            "ReceiveMessage",
            {"QueueUrl": queue, "MaxNumberOfMessages": 10, name: names},
        )
        assert response.status_code == 400, response.text
        assert error_code(response) == "InvalidParameterValue"
    response = signed(
        server, agent, "GetQueueAttributes", {"QueueUrl": queue, "AttributeNames": names}
    )
    assert (response.status_code, error_code(response)) == (400, "InvalidParameterValue")
    assert list(Todo.objects.values_list("state", "attempt")) == [(State.PENDING, 0)]


def test_any_todo_renders_as_a_message(
    connect: Callable[..., Client], agent: Agent, make_todo: Callable[..., Todo]
) -> None:
    """Whatever a producer wrote, a receive answers it: attributes not of SQS's shape are left
    out, a payload that is not an object is the body's JSON."""
    shaped = {"DataType": "String", "StringValue": "kept"}
    make_todo(
        queue="jobs",
        kind=messages.KIND,
        payload={"body": "odd", "attributes": {"ok": shaped, "bad": {"DataType": "String"}}},
    )
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "WITH made AS (INSERT INTO todos (queue, kind, payload, errors_bytes)"
            " VALUES ('jobs', 'sqs', '[1, \"two\"]', 26) RETURNING id)"
            " INSERT INTO todo_errors (todo_id, attempt, entry, size)"
            ' SELECT id, 0, \'{"claimed_at": "yesterday"}\', 26 FROM made'
        )
    sqs = connect(agent)
    received = sqs.receive_message(
        QueueUrl=url(sqs),
        MaxNumberOfMessages=10,
        MessageAttributeNames=["All"],
        MessageSystemAttributeNames=["All"],
    )["Messages"]
    assert sorted(message["Body"] for message in received) == [
        "odd",
        '{"kind":"sqs","title":"","payload":[1,"two"]}',
    ]
    [with_attributes] = [message for message in received if "MessageAttributes" in message]
    assert with_attributes["MessageAttributes"] == {"ok": shaped}
    assert set(Todo.objects.values_list("state", flat=True)) == {State.CLAIMED}


def test_a_batch_that_cannot_be_answered_is_given_back(
    agent: Agent, make_todo: Callable[..., Todo], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last line of defence: a received batch is released (attempts refunded) when its
    answer fails, never left claimed for the visibility timeout."""
    for _ in range(3):
        make_todo(queue="jobs", kind="k")

    def broken(todo: Todo, wanted: set[str], attribute_names: set[str]) -> dict[str, Any]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(views, "_message", broken)
    params = {"QueueUrl": "http://testserver/sqs/jobs", "MaxNumberOfMessages": 10}
    try:
        with pytest.raises(RuntimeError):
            async_to_sync(views.receive_message)(agent, params, HttpRequest())
        wait_until(  # on a claim thread, at once
            lambda: set(Todo.objects.values_list("state", "attempt")) == {(State.PENDING, 0)},
            "the batch to be given back",
        )
    finally:
        long_polls.stop()


def test_a_stale_handle_after_a_zero_visibility_timeout_is_refused(
    connect: Callable[..., Client], agent: Agent
) -> None:
    """Release gives the attempt back: the next receipt has the same attempt, and before, the
    same handle, which the earlier receiver could still delete with."""
    sqs = connect(agent)
    queue = url(sqs)
    sqs.send_message(QueueUrl=queue, MessageBody="again")
    [first] = sqs.receive_message(QueueUrl=queue)["Messages"]
    sqs.change_message_visibility(
        QueueUrl=queue, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0
    )
    [second] = sqs.receive_message(QueueUrl=queue)["Messages"]
    assert second["MessageId"] == first["MessageId"]
    assert second["ReceiptHandle"] != first["ReceiptHandle"]
    stale = first["ReceiptHandle"]
    with pytest.raises(ClientError) as error:
        sqs.delete_message(QueueUrl=queue, ReceiptHandle=stale)
    assert code(error) == "ReceiptHandleIsInvalid"
    with pytest.raises(ClientError) as error:
        sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle=stale, VisibilityTimeout=60)
    assert code(error) == "ReceiptHandleIsInvalid"
    assert Todo.objects.get(pk=first["MessageId"]).state == State.CLAIMED
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=second["ReceiptHandle"])
    assert Todo.objects.get(pk=first["MessageId"]).state == State.DONE


def test_a_request_signed_without_its_action_is_refused(
    server: str, connect: Callable[..., Client], agent: Agent
) -> None:
    """Signed over host, content type and date only, a captured request could be sent again,
    within the 5 minutes, as another action."""
    sqs = connect(agent)
    queue = url(sqs)
    sqs.send_message(QueueUrl=queue, MessageBody="held")
    [message] = sqs.receive_message(QueueUrl=queue)["Messages"]
    params = {"QueueUrl": queue, "ReceiptHandle": message["ReceiptHandle"]}
    replayed = signed(server, agent, "DeleteMessage", params, sign_target=False)
    assert (replayed.status_code, error_code(replayed)) == (403, "SignatureDoesNotMatch")
    assert Todo.objects.get(pk=message["MessageId"]).state == State.CLAIMED
    assert signed(server, agent, "DeleteMessage", params).status_code == 200
    assert Todo.objects.get(pk=message["MessageId"]).state == State.DONE


def test_a_deleted_agent_created_again_gets_a_new_secret(
    connect: Callable[..., Client], agent: Agent
) -> None:
    old = secret_for(agent)
    assert connect(agent).list_queues()["QueueUrls"]
    agent.delete()
    again = accounts.create_agent("sqs-bot", claim_queues=["jobs"], create_queues=["jobs"])[0]
    assert secret_for(again) != old
    with pytest.raises(ClientError) as error:
        connect(again, secret=old).list_queues()
    assert code(error) == "SignatureDoesNotMatch"
    assert connect(again).list_queues()["QueueUrls"]


def test_a_revoked_agent_made_active_again_has_neither_old_credential(
    server: str, connect: Callable[..., Client]
) -> None:
    """Whatever makes the agent active again (here, its row), the token and secret it had
    before its revocation stay dead; rotating gives it new ones."""
    agent, token = accounts.create_agent("sqs-bot", claim_queues=["jobs"])
    secret = secret_for(agent)
    with httpx.Client(
        base_url=f"{server}/api", headers={"Authorization": f"Bearer {token}"}
    ) as api:
        assert api.post("/claim/", json={"ttl": 30}).status_code == 200
        accounts.revoke(agent)
        refused = api.post("/claim/", json={"ttl": 30})
        assert refused.status_code == 401 and "revoked" in refused.json()["detail"]
        Agent.objects.filter(pk=agent.pk).update(is_active=True)
        agent.refresh_from_db()
        with pytest.raises(ClientError) as error:
            connect(agent, secret=secret).list_queues()
        assert code(error) == "SignatureDoesNotMatch"
        assert api.post("/claim/", json={"ttl": 30}).status_code == 401
        new_token = accounts.rotate_token(agent)
        assert connect(agent).list_queues()["QueueUrls"]
        with pytest.raises(ClientError):
            connect(agent, secret=secret).list_queues()
        assert api.post("/claim/", json={"ttl": 30}).status_code == 401
        fresh = {"Authorization": f"Bearer {new_token}"}
        assert api.post("/claim/", json={"ttl": 30}, headers=fresh).status_code == 200


@pytest.mark.parametrize("decoded", ["td_\x00x 1 0", "\x00 1 0", "td_\udcff 1 0"])
def test_a_receipt_naming_no_possible_todo_is_a_client_error(
    connect: Callable[..., Client], agent: Agent, decoded: str
) -> None:
    """A handle whose id holds a NUL (or is no text) is ReceiptHandleIsInvalid on every action
    that takes one, not an InternalFailure."""
    sqs = connect(agent)
    queue = url(sqs)
    handle = base64.urlsafe_b64encode(decoded.encode(errors="surrogatepass")).decode()
    with pytest.raises(ClientError) as deleted:
        sqs.delete_message(QueueUrl=queue, ReceiptHandle=handle)
    with pytest.raises(ClientError) as changed:
        sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle=handle, VisibilityTimeout=0)
    assert code(deleted) == code(changed) == "ReceiptHandleIsInvalid"
    batch = sqs.delete_message_batch(QueueUrl=queue, Entries=[{"Id": "1", "ReceiptHandle": handle}])
    assert [failed["Code"] for failed in batch["Failed"]] == ["ReceiptHandleIsInvalid"]


def test_plain_http_gets_djangos_redirect_and_does_nothing(
    subprocess_env: dict[str, str], agent: Agent
) -> None:
    """With SECURE_SSL_REDIRECT, SQS over plain HTTP is answered as the rest of the project:
    Django's redirect to HTTPS, and nothing sent or received; behind a proxy that says the
    request was HTTPS (SECURE_PROXY_SSL_HEADER), it works, with the HSTS header."""
    https = {
        "SECURE_SSL_REDIRECT": "on",
        "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
        "SECURE_HSTS_SECONDS": "3600",
    }
    with serve({**subprocess_env, **https}) as (api, process):
        base = api.removesuffix("/api")
        sent = {"QueueUrl": f"{base}/sqs/jobs", "MessageBody": "hi"}
        plain = httpx.post(
            f"{base}/sqs/",
            content=json.dumps(sent),
            headers=sqs_headers(agent, f"{base}/sqs/", "SendMessage", sent),
        )
        proxied = httpx.post(
            f"{base}/sqs/",
            content=json.dumps(sent),
            headers={
                **sqs_headers(agent, f"{base}/sqs/", "SendMessage", sent),
                "X-Forwarded-Proto": "https",
            },
        )
        process.terminate()
        assert "Traceback" not in process.communicate(timeout=30)[0]
    assert plain.status_code == 301
    assert plain.headers["location"] == base.replace("http://", "https://") + "/sqs/"
    assert proxied.status_code == 200, proxied.text
    assert proxied.headers["strict-transport-security"] == "max-age=3600"
    assert Todo.objects.filter(queue="jobs").count() == 1
