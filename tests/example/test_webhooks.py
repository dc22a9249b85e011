"""The example webhook: what each delivery writes (an event and a todo, or nothing at all)."""

from __future__ import annotations

import io
import json
import re
import threading
import time
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.http import HttpRequest
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext

from example_project.webhooks import Delivery, Received, Rejected, read_body, sign, store
from switchboard_todos.models import Event, State, Todo
from tests.conftest import run_in_threads
from tests.example.deliveries import PUSH, SECRET, deliver


def rows() -> tuple[int, int]:
    """(events, todos): what a delivery may have written."""
    return Event.objects.count(), Todo.objects.count()


@pytest.mark.django_db
def test_signed_delivery_stores_the_event_and_enqueues_a_todo() -> None:
    """202 with the todo's id; the event and the todo hold the delivery, linked."""
    client = Client(enforce_csrf_checks=True)  # the endpoint is CSRF-exempt
    body = json.dumps(PUSH, indent=2).encode()  # signed as sent, not as re-serialised
    response = deliver(client, body, delivery="72d3162e-cc78")
    assert response.status_code == 202
    answer = response.json()
    assert answer["duplicate"] is False
    assert rows() == (1, 1)
    event = Event.objects.get()
    todo = Todo.objects.get()
    assert answer == {"todo_id": todo.id, "event_id": event.id, "duplicate": False}
    assert (event.source, event.kind, event.delivery_id) == ("github", "push", "72d3162e-cc78")
    assert event.payload == PUSH
    assert todo.event_id == event.id
    assert (todo.kind, todo.source, todo.title) == ("github.push", "github", "push from github")
    assert todo.idempotency_key == "github:72d3162e-cc78"
    assert todo.payload == PUSH
    assert (todo.state, todo.queue, todo.attempt) == (State.PENDING, "default", 0)


@pytest.mark.django_db
def test_generic_headers_name_the_delivery_and_the_kind(client: Client) -> None:
    """Idempotency-Key and X-Event-Kind serve senders other than GitHub."""
    response = deliver(
        client,
        b'{"failures": 1}',
        source="example",
        secret="example-test-secret",
        delivery=None,
        event=None,
        **{"Idempotency-Key": "order-17", "X-Event-Kind": "flaky"},
    )
    assert response.status_code == 202
    todo = Todo.objects.get(pk=response.json()["todo_id"])
    assert (todo.kind, todo.idempotency_key) == ("example.flaky", "example:order-17")
    assert Event.objects.get().kind == "flaky"


@pytest.mark.django_db
def test_delivery_without_a_kind(client: Client) -> None:
    """Without an event header the todo's kind is the source alone."""
    response = deliver(client, event=None)
    assert response.status_code == 202
    todo = Todo.objects.get()
    assert (todo.kind, todo.title) == ("github", "delivery from github")


@pytest.mark.django_db
def test_event_is_not_kept_without_its_todo(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Event and todo are one transaction: when the todo fails to be written, so does the event."""

    def fail(**fields: Any) -> None:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(Todo.objects, "create_todo", fail)
    with pytest.raises(RuntimeError, match="went away"):
        deliver(client)
    assert rows() == (0, 0)


@pytest.mark.django_db
def test_repeated_delivery_answers_200_with_the_same_todo(client: Client) -> None:
    """A delivery id seen before writes nothing, even once its todo is done."""
    first = deliver(client).json()
    assert deliver(client).status_code == 200
    todo = Todo.objects.claim(first["todo_id"], "w1", 30)
    Todo.objects.complete(todo.id, "w1", {"ok": True})

    again = deliver(client, b'{"changed": true}')  # same id, other body: still the same delivery

    assert again.status_code == 200
    assert again.json() == {**first, "duplicate": True}
    assert rows() == (1, 1)
    assert Todo.objects.get().state == State.DONE


@pytest.mark.django_db
def test_same_delivery_id_from_another_source_is_another_delivery(client: Client) -> None:
    """Delivery ids are scoped by source: the events and the todos' keys differ."""
    deliver(client, delivery="42")
    other = deliver(client, source="example", secret="example-test-secret", delivery="42")
    assert other.status_code == 202
    assert rows() == (2, 2)


@pytest.mark.django_db(transaction=True)
def test_concurrent_copies_of_one_delivery_make_one_event_and_one_todo() -> None:
    """Copies racing in on their own connections: one 202, the rest 200 with the same todo."""

    def post(index: int) -> tuple[int, Any]:
        response = deliver(Client(), delivery="race-1")
        return response.status_code, response.json()["todo_id"]

    answers = run_in_threads(8, post)

    assert sorted(status for status, _ in answers) == [200] * 7 + [202]
    assert {todo_id for _, todo_id in answers} == {Todo.objects.get().id}
    assert rows() == (1, 1)


@pytest.mark.django_db(transaction=True)
def test_copy_arriving_mid_transaction_waits_for_the_first_and_answers_its_todo() -> None:
    """The second copy blocks on the unique index until the first commits, then skips."""
    first_stored = threading.Event()
    may_commit = threading.Event()
    stored: list[Received] = []

    def first_copy() -> None:
        try:
            with transaction.atomic():
                stored.append(store(Delivery("github", "push", "slow-1", PUSH)))
                first_stored.set()
                may_commit.wait(timeout=30)
        finally:
            connections.close_all()

    def second_copy() -> None:
        try:
            answers.append(deliver(Client(), delivery="slow-1").json())
        finally:
            connections.close_all()

    answers: list[dict[str, Any]] = []
    first = threading.Thread(target=first_copy)
    first.start()
    assert first_stored.wait(timeout=30)
    second = threading.Thread(target=second_copy)
    second.start()
    while not waiting_for_a_lock():  # the second copy's insert is blocked: now let the first go
        time.sleep(0.01)
    may_commit.set()
    first.join()
    second.join()

    (received,) = stored
    assert received.todo is not None
    assert answers == [
        {"todo_id": received.todo.id, "event_id": received.event.id, "duplicate": True}
    ]
    assert rows() == (1, 1)


def waiting_for_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        (waiting,) = cursor.fetchone()
    return bool(waiting)


# Refusals: each writes nothing and says why, in JSON.

GOOD = json.dumps(PUSH).encode()


@pytest.mark.parametrize(
    ("options", "status", "message"),
    [
        pytest.param(
            {"signature": ""}, 401, "X-Hub-Signature-256 header is missing", id="unsigned"
        ),
        pytest.param({"secret": "wrong"}, 401, "does not match the body", id="wrong-secret"),
        pytest.param(
            {"signature": sign(SECRET, GOOD + b" ")}, 401, "does not match", id="other-body"
        ),
        pytest.param(
            {"signature": sign(SECRET, GOOD).removeprefix("sha256=")},
            401,
            "does not match",
            id="no-prefix",
        ),
        pytest.param({"signature": "sha256=€"}, 401, "does not match", id="not-ascii"),
        pytest.param(
            {"signature": "", "delivery": None, "body": b"{"}, 401, "missing", id="unsigned-first"
        ),
        pytest.param({"body": b'{"ref": '}, 400, "not valid JSON", id="truncated-json"),
        pytest.param(
            {"body": b"", "content_type": "application/json"},
            415,
            "no Content-Type",
            id="empty-body",
        ),  # the test client sends no type without a body
        pytest.param({"body": b"\xff\xfe{}"}, 400, "not valid JSON", id="not-utf8"),
        pytest.param({"body": b'{"n": NaN}'}, 400, "NaN is not a JSON number", id="nan"),
        pytest.param({"body": b"[1, 2]"}, 400, "must be a JSON object, not an array", id="array"),
        pytest.param({"body": b'"push"'}, 400, "not a string", id="string"),
        pytest.param({"body": b'{"a": "\\u0000"}'}, 400, "NUL characters", id="nul"),
        pytest.param(
            {"body": b'{"a": "\\ud800"}'},
            400,
            "payload contains an unpaired surrogate",
            id="lone-surrogate",
        ),
        pytest.param(
            {"body": b'{"\\udfff": 1}'}, 400, "unpaired surrogate", id="lone-surrogate-key"
        ),
        pytest.param(
            {"body": b'{"a":' * 5000 + b"{}" + b"}" * 5000},
            400,
            "nests arrays and objects too",
            id="5000-deep",
        ),
        pytest.param(
            {"body": b'{"a":' * 300 + b"{}" + b"}" * 300},
            400,
            "301 levels deep",
            id="past-the-depth-limit",
        ),
        pytest.param({"content_type": "text/plain"}, 415, "not text/plain", id="text-plain"),
        pytest.param(
            {"content_type": "application/x-www-form-urlencoded"},
            415,
            "form-encoded",
            id="form-encoded",
        ),
        pytest.param({"content_type": ""}, 415, "with no Content-Type", id="no-content-type"),
        pytest.param(
            {"content_type": "text/plain", "signature": ""},
            401,
            "missing",
            id="unsigned-before-media-type",
        ),
        pytest.param({"delivery": None}, 400, "needed to recognise the same delivery", id="no-id"),
        pytest.param({"delivery": "k" * 300}, 400, "delivery_id is 300", id="long-id"),
        pytest.param({"delivery": "k" * 250}, 400, "idempotency_key is 257", id="long-key"),
        pytest.param({"event": "push now"}, 400, "must not contain whitespace", id="bad-kind"),
        pytest.param({"source": "gitlab"}, 404, "No webhook source 'gitlab'", id="unknown"),
    ],  # fmt: skip
)
@pytest.mark.django_db
def test_refused_delivery_writes_nothing(
    client: Client, options: dict[str, Any], status: int, message: str
) -> None:
    """Bad or missing signature 401, bad input 400, unknown source 404: no event, no todo."""
    response = deliver(client, options.pop("body", GOOD), **options)
    assert response.status_code == status
    assert message in response.json()["error"]
    assert rows() == (0, 0)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "content_type",
    ["application/json; charset=utf-8", "Application/JSON", "application/vnd.github+json"],
)
def test_json_media_types_are_taken(client: Client, content_type: str) -> None:
    """JSON with a charset, in any case, or as a vendor +json type, is a JSON body."""
    assert deliver(client, content_type=content_type).status_code == 202


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["get", "put", "delete"])
def test_other_methods_are_refused(client: Client, method: str) -> None:
    """Anything but POST answers 405 and names POST in Allow."""
    response = getattr(client, method)("/hooks/github/")
    assert response.status_code == 405
    assert response["Allow"] == "POST"
    assert "POST" in response.json()["error"]
    assert rows() == (0, 0)


@pytest.mark.django_db
@override_settings(WEBHOOK_MAX_BYTES=1000)
def test_body_over_the_limit_is_refused_by_its_length(client: Client) -> None:
    """A body one byte over WEBHOOK_MAX_BYTES answers 413; one at the limit is taken."""
    at_limit = json.dumps({"pad": "x" * 989}).encode()
    assert len(at_limit) == 1000
    over = at_limit.replace(b"x", b"xx", 1)

    refused = deliver(client, over, delivery="big")
    assert refused.status_code == 413
    assert refused.json()["error"] == "The body is 1001 bytes long; the limit is 1000."
    assert rows() == (0, 0)
    assert deliver(client, at_limit, delivery="fits").status_code == 202


@pytest.mark.parametrize("length", [None, "many"])
def test_body_without_a_length_is_read_no_further_than_the_limit(length: str | None) -> None:
    """With no usable Content-Length (a chunked upload), at most limit + 1 bytes are read."""
    request = HttpRequest()
    if length is not None:
        request.META["CONTENT_LENGTH"] = length
    stream = io.BytesIO(b"x" * 10_000)
    request._stream = stream
    with pytest.raises(Rejected) as refused:
        read_body(request, 100)
    assert refused.value.status == 413
    assert stream.tell() == 101


@pytest.mark.django_db
def test_repeat_costs_three_statements_and_writes_nothing(client: Client) -> None:
    """A repeat: the insert that skips, the stored event, its todo."""
    deliver(client)
    with CaptureQueriesContext(connection) as captured:
        assert deliver(client).status_code == 200
    statements = [
        re.sub(r"--.*", "", query["sql"]).split()[0] for query in captured.captured_queries
    ]
    assert [s for s in statements if s not in ("SAVEPOINT", "RELEASE")] == [
        "INSERT",
        "SELECT",
        "SELECT",
    ]
