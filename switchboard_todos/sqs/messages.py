"""Messages as SQS shows them: bodies, attributes and their MD5 digests, receipt handles.

A message sent over SQS is a todo of kind `sqs` whose payload keeps the body and the message
attributes exactly as sent. Any other todo received over SQS has for its body the JSON of its
kind, title and payload, so an SQS consumer can work todos enqueued by any producer.

A receipt handle names the todo and the attempt it was received for, so that a handle from an
earlier receipt (the lease lapsed, and the message was received again) no longer deletes or
extends anything: ReceiptHandleIsInvalid.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from hashlib import md5
from typing import Any, NamedTuple

from switchboard_todos.models import Todo

#: The kind of the todos SendMessage makes.
KIND = "sqs"


class Receipt(NamedTuple):
    todo_id: str
    attempt: int


def body_of(todo: Todo) -> str:
    """The MessageBody of a todo."""
    if todo.kind == KIND and isinstance(todo.payload.get("body"), str):
        return str(todo.payload["body"])
    return json.dumps(
        {"kind": todo.kind, "title": todo.title, "payload": todo.payload}, separators=(",", ":")
    )


def attributes_of(todo: Todo) -> dict[str, Any]:
    """The MessageAttributes of a todo (only messages sent over SQS have any)."""
    attributes = todo.payload.get("attributes") if todo.kind == KIND else None
    return dict(attributes) if isinstance(attributes, dict) else {}


def md5_of_body(body: str) -> str:
    return md5(body.encode(), usedforsecurity=False).hexdigest()


def md5_of_attributes(attributes: dict[str, Any]) -> str:
    """SQS's digest of message attributes: each, sorted by name, as length-prefixed name, data
    type, transport type (1 string, 2 binary) and value."""
    digest = md5(usedforsecurity=False)
    for name in sorted(attributes):
        attribute = attributes[name]
        data_type = str(attribute["DataType"])
        digest.update(_prefixed(name.encode()))
        digest.update(_prefixed(data_type.encode()))
        if "BinaryValue" in attribute:
            digest.update(b"\x02" + _prefixed(base64.b64decode(attribute["BinaryValue"])))
        else:
            digest.update(b"\x01" + _prefixed(str(attribute["StringValue"]).encode()))
    return digest.hexdigest()


def _prefixed(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def receipt_for(todo: Todo) -> str:
    return base64.urlsafe_b64encode(f"{todo.id} {todo.attempt}".encode()).decode()


def read_receipt(handle: object) -> Receipt | None:
    """The todo and attempt a handle names, or None for something that is not a handle."""
    if not isinstance(handle, str) or len(handle) > 200:
        return None
    try:
        todo_id, attempt = base64.urlsafe_b64decode(handle.encode()).decode().split(" ")
        return Receipt(todo_id, int(attempt))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
