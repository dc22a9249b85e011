"""Inbound webhooks: check a delivery, then store its event and enqueue its todo together.

Senders deliver at least once and send again on any doubt, so each delivery carries an id
(`X-GitHub-Delivery`, or `Idempotency-Key` from other senders) and a repeat of a stored id
writes nothing. The signature is GitHub's: `X-Hub-Signature-256: sha256=<hex>`, the
HMAC-SHA256 of the raw body keyed with the source's secret from `WEBHOOK_SECRETS`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest

from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.models import Event, Todo

SIGNATURE_HEADER = "X-Hub-Signature-256"
DELIVERY_HEADERS = ("X-GitHub-Delivery", "Idempotency-Key")
KIND_HEADERS = ("X-GitHub-Event", "X-Event-Kind")
DEFAULT_MAX_BYTES = 1024 * 1024

_JSON_TYPES: dict[type, str] = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


class Rejected(Exception):
    """A delivery refused before anything was written; `status` is the HTTP answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Delivery:
    """A delivery whose signature and headers checked out."""

    source: str
    kind: str
    delivery_id: str
    payload: dict[str, Any]

    @property
    def todo_kind(self) -> str:
        """The handler's kind: `github.push` for a push from source `github`."""
        return f"{self.source}.{self.kind}" if self.kind else self.source

    @property
    def idempotency_key(self) -> str:
        """The todo's key, scoped by source: two senders may well use the same delivery id."""
        return f"{self.source}:{self.delivery_id}"


@dataclass(frozen=True)
class Received:
    """What a delivery left in the database; `created` is False for a repeat."""

    event: Event
    todo: Todo | None
    created: bool


def sign(secret: str, body: bytes) -> str:
    """The signature header's value for `body`, as the sender computes it."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def parse(request: HttpRequest, source: str) -> Delivery:
    """Check a delivery, strangers' mistakes first; raise Rejected with the answer to give."""
    secret = getattr(settings, "WEBHOOK_SECRETS", {}).get(source)
    if not secret:
        raise Rejected(404, f"No webhook source {source!r} is configured.")
    body = read_body(request, getattr(settings, "WEBHOOK_MAX_BYTES", DEFAULT_MAX_BYTES))
    verify(secret, body, request.headers.get(SIGNATURE_HEADER))
    check_content_type(request.content_type)
    delivery_id = _first_header(request, DELIVERY_HEADERS)
    if not delivery_id:
        raise Rejected(
            400,
            f"The delivery has no {' or '.join(DELIVERY_HEADERS)} header: it is needed to "
            "recognise the same delivery sent twice.",
        )
    return Delivery(source, _first_header(request, KIND_HEADERS), delivery_id, _payload(body))


def read_body(request: HttpRequest, limit: int) -> bytes:
    """The raw body; past `limit` bytes refused by its Content-Length, or after limit + 1 read."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        raise Rejected(413, f"The body is {declared} bytes long; the limit is {limit}.")
    body = request.read(limit + 1)
    if len(body) > limit:
        raise Rejected(413, f"The body is longer than the limit of {limit} bytes.")
    return body


def verify(secret: str, body: bytes, signature: str | None) -> None:
    """Check `signature` against the body's HMAC-SHA256, in constant time."""
    if not signature:
        raise Rejected(
            401,
            f"The {SIGNATURE_HEADER} header is missing: send sha256=<hex HMAC-SHA256 of the "
            "body, keyed with the source's secret>.",
        )
    expected = sign(secret, body).encode()
    if not hmac.compare_digest(expected, signature.encode("latin-1", "replace")):
        raise Rejected(401, f"The {SIGNATURE_HEADER} signature does not match the body.")


def check_content_type(content_type: str | None) -> None:
    """Only JSON is taken: application/json, or a vendor type such as application/vnd.x+json."""
    media = (content_type or "").lower()
    if media != "application/json" and not (
        media.startswith("application/") and media.endswith("+json")
    ):
        described = f"not {content_type}" if content_type else "with no Content-Type"
        raise Rejected(
            415,
            f"The body must be sent as application/json, {described}. (A GitHub webhook "
            "sending form-encoded payloads: set its content type to application/json.)",
        )


def _first_header(request: HttpRequest, names: tuple[str, ...]) -> str:
    return next((value for name in names if (value := request.headers.get(name))), "")


def _payload(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body, parse_constant=_refuse_constant)
    except ValueError as error:
        raise Rejected(400, f"The body is not valid JSON: {error}.") from error
    except RecursionError:
        raise Rejected(400, "The body nests arrays and objects too deeply to be read.") from None
    if not isinstance(value, dict):
        described = _JSON_TYPES.get(type(value), type(value).__name__)
        raise Rejected(400, f"The body must be a JSON object, not {described}.")
    return value


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def store(delivery: Delivery) -> Received:
    """Store the event and enqueue its todo in one transaction, unless the delivery is a repeat.

    A repeat (same source and delivery id) writes nothing and returns the first copy's todo;
    of copies arriving at once, one is stored (`Event.objects.record`). Input the event or the
    todo refuses (InvalidTodo) raises Rejected(400), and the transaction leaves nothing behind.
    """
    try:
        with transaction.atomic():
            event, created = Event.objects.record(
                source=delivery.source,
                kind=delivery.kind,
                payload=delivery.payload,
                delivery_id=delivery.delivery_id,
            )
            if not created:
                return Received(event, event.todos.order_by("created_at").first(), created=False)
            todo, created = Todo.objects.create_todo(
                kind=delivery.todo_kind,
                title=f"{delivery.kind or 'delivery'} from {delivery.source}",
                payload=delivery.payload,
                source=delivery.source,
                idempotency_key=delivery.idempotency_key,
                event=event,
            )
    except InvalidTodo as error:
        raise Rejected(400, str(error)) from error
    return Received(event, todo, created)
