"""Messages as SQS shows them: bodies, attributes and their MD5 digests, receipt handles.

A message sent over SQS is a todo of kind `sqs` whose payload keeps the body and the message
attributes, checked as SQS checks them before anything is written (`checked_attributes`). Any
other todo received over SQS has for its body the JSON of its kind, title and payload, so an
SQS consumer can work todos enqueued by any producer. Whatever a producer put in a todo, it
renders as a message: attributes that are not SQS's shape are left out, never an error after
the claim.

A receipt handle names the todo, the attempt and the moment of the claim it was received by,
so that a handle from an earlier receipt of the same message (the lease expired, or was given
back with a visibility timeout of 0, and the message was received again) no longer deletes or
extends anything: ReceiptHandleIsInvalid.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from hashlib import md5
from typing import Any, NamedTuple

from switchboard_todos import tracing, validation
from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.managers import Receipt
from switchboard_todos.models import Todo

#: The kind of the todos SendMessage makes.
KIND = "sqs"
#: As SQS: most attributes per message, longest name, longest data type.
MAX_ATTRIBUTES = 10
MAX_NAME_LENGTH = 256
MAX_DATA_TYPE_LENGTH = 256
#: A message body or attribute value: at most the JSON limit of a todo, which the core checks.
MAX_VALUE_LENGTH = 1024 * 1024
_NAME = re.compile(r"[A-Za-z0-9_-](?:[A-Za-z0-9_.-]*[A-Za-z0-9_-])?")
_RESERVED = ("aws.", "amazon.")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


#: X-Ray's trace header (AWSTraceHeader): Root=1-<8 hex: epoch>-<24 hex>;Parent=<16 hex>;
#: Sampled=<0|1>, in any order, with fields of its own possibly added.
_XRAY_ROOT = re.compile(r"(?:^|;)\s*Root=1-([0-9a-f]{8})-([0-9a-f]{24})\s*(?:;|$)")
_XRAY_PARENT = re.compile(r"(?:^|;)\s*Parent=([0-9a-f]{16})\s*(?:;|$)")
_XRAY_SAMPLED = re.compile(r"(?:^|;)\s*Sampled=1\s*(?:;|$)")
#: The longest trace header read: X-Ray's are under 100 characters, W3C's traceparent 55.
MAX_TRACE_HEADER_LENGTH = 1024


class Handle(NamedTuple):
    """What a receipt handle names: a todo, and the claim it was received by."""

    todo_id: str
    receipt: Receipt


def checked_attributes(value: object) -> dict[str, dict[str, str]]:
    """SendMessage's MessageAttributes as they are stored, or InvalidTodo saying what is wrong.

    As SQS: at most 10; names of letters, digits, `_ - .` (not first or last, never two in a
    row, not starting with AWS. or Amazon.); a DataType of String, Number or Binary, with an
    optional `.label`; a StringValue (a decimal for Number) or a base64 BinaryValue.
    """
    if not isinstance(value, dict):
        raise InvalidTodo("MessageAttributes must map attribute names to values.")
    if len(value) > MAX_ATTRIBUTES:
        raise InvalidTodo(f"A message has at most {MAX_ATTRIBUTES} MessageAttributes.")
    return {_name(name): _attribute(name, attribute) for name, attribute in value.items()}


def _name(name: str) -> str:
    if (
        len(name) > MAX_NAME_LENGTH
        or not _NAME.fullmatch(name)
        or ".." in name
        or name.lower().startswith(_RESERVED)
    ):
        raise InvalidTodo(
            f"MessageAttribute name {name[:MAX_NAME_LENGTH]!r} is not valid: up to "
            f"{MAX_NAME_LENGTH} letters, digits and _ - ., no period first, last or twice in a "
            "row, not starting with AWS. or Amazon."
        )
    return name


def _attribute(name: str, attribute: object) -> dict[str, str]:
    if not isinstance(attribute, dict):
        raise InvalidTodo(f"MessageAttribute {name!r} must be an object with a DataType.")
    data_type = validation.text(
        attribute.get("DataType"), f"DataType of {name!r}", MAX_DATA_TYPE_LENGTH, required=True
    )
    base = data_type.partition(".")[0]
    if base == "Binary":
        encoded = validation.text(
            attribute.get("BinaryValue"), f"BinaryValue of {name!r}", MAX_VALUE_LENGTH
        )
        try:
            base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidTodo(f"BinaryValue of {name!r} is not base64.") from None
        return {"DataType": data_type, "BinaryValue": encoded}
    if base not in ("String", "Number"):
        raise InvalidTodo(
            f"DataType of {name!r} must be String, Number or Binary (with an optional "
            f".label), not {data_type!r}."
        )
    text = validation.text(
        attribute.get("StringValue"), f"StringValue of {name!r}", MAX_VALUE_LENGTH
    )
    if base == "Number" and not _is_decimal(text):
        raise InvalidTodo(f"StringValue of {name!r} must be a number for DataType Number.")
    return {"DataType": data_type, "StringValue": text}


def _is_decimal(text: str) -> bool:
    try:
        return Decimal(text).is_finite()
    except InvalidOperation:
        return False


def body_of(todo: Todo) -> str:
    """The MessageBody of a todo."""
    payload = todo.payload
    if todo.kind == KIND and isinstance(payload, dict) and isinstance(payload.get("body"), str):
        return str(payload["body"])
    return json.dumps(
        {"kind": todo.kind, "title": todo.title, "payload": payload}, separators=(",", ":")
    )


def attributes_of(todo: Todo) -> dict[str, dict[str, str]]:
    """The MessageAttributes of a todo: those of its payload that are SQS's shape (only messages
    sent over SQS have any; a producer may have written anything there)."""
    payload = todo.payload
    if todo.kind != KIND or not isinstance(payload, dict):
        return {}
    attributes = payload.get("attributes")
    if not isinstance(attributes, dict):
        return {}
    shaped = {}
    for name, attribute in attributes.items():
        try:
            shaped[_name(name)] = _attribute(name, attribute)
        except InvalidTodo:
            continue
    return shaped


def md5_of_body(body: str) -> str:
    return md5(body.encode(), usedforsecurity=False).hexdigest()


def md5_of_attributes(attributes: dict[str, dict[str, str]]) -> str:
    """SQS's digest of checked message attributes: each, sorted by name, as length-prefixed
    name, data type, transport type (1 string, 2 binary) and value."""
    digest = md5(usedforsecurity=False)
    for name in sorted(attributes):
        attribute = attributes[name]
        digest.update(_prefixed(name.encode()))
        digest.update(_prefixed(attribute["DataType"].encode()))
        if "BinaryValue" in attribute:
            digest.update(b"\x02" + _prefixed(base64.b64decode(attribute["BinaryValue"])))
        else:
            digest.update(b"\x01" + _prefixed(attribute["StringValue"].encode()))
    return digest.hexdigest()


def _prefixed(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def receipt_for(todo: Todo) -> str:
    """The handle of this receipt of a claimed todo: its id, attempt and claim's microsecond."""
    assert todo.claimed_at is not None
    claimed = (todo.claimed_at - _EPOCH) // _MICROSECOND
    return base64.urlsafe_b64encode(f"{todo.id} {todo.attempt} {claimed}".encode()).decode()


def read_receipt(handle: object) -> Handle | None:
    """The todo and receipt a handle names, or None for something that is not a handle."""
    if not isinstance(handle, str) or len(handle) > 300:
        return None
    try:
        text = base64.urlsafe_b64decode(handle.encode()).decode()
        todo_id, attempt, claimed = text.rsplit(" ", 2)
        # An id no todo can have (a NUL, which PostgreSQL's text refuses) names no receipt.
        return Handle(
            validation.todo_id(todo_id),
            Receipt(int(attempt), _EPOCH + int(claimed) * _MICROSECOND),
        )
    except (binascii.Error, ValueError, OverflowError, InvalidTodo):
        return None


def xray_header(stored: str | None) -> str | None:
    """A todo's AWSTraceHeader, as ReceiveMessage gives it: its stored trace context
    (tracing.py) in X-Ray's form, or None."""
    found = tracing.traceparent(stored)
    if found is None:
        return None
    trace, parent, flags = found
    sampled = int(flags, 16) & 1
    return f"Root=1-{trace[:8]}-{trace[8:]};Parent={parent};Sampled={sampled}"


def trace_carrier(entry: dict[str, Any]) -> dict[str, str]:
    """The W3C trace context a SendMessage entry carries (tracing.remote): its `traceparent`
    (and `tracestate`, `baggage`) String message attributes, else its AWSTraceHeader system
    attribute (X-Ray's), rewritten as a traceparent. A malformed one is ignored, as W3C Trace
    Context says; an oversized one too."""
    found = {
        name: value
        for name in ("traceparent", "tracestate", "baggage")
        if (value := _string_attribute(entry.get("MessageAttributes"), name)) is not None
    }
    if "traceparent" in found:
        return found
    xray = _string_attribute(entry.get("MessageSystemAttributes"), "AWSTraceHeader")
    root = parent = None
    if xray is not None:
        root, parent = _XRAY_ROOT.search(xray), _XRAY_PARENT.search(xray)
    if root is None or parent is None:
        return {}
    flags = "01" if _XRAY_SAMPLED.search(xray or "") else "00"
    return {"traceparent": f"00-{root[1]}{root[2]}-{parent[1]}-{flags}"}


def _string_attribute(attributes: object, name: str) -> str | None:
    """The StringValue of attribute `name` of `attributes` (a message's, or its system
    attributes), when it has one of a readable length."""
    if not isinstance(attributes, dict):
        return None
    attribute = attributes.get(name)
    value = attribute.get("StringValue") if isinstance(attribute, dict) else None
    if not isinstance(value, str) or len(value) > MAX_TRACE_HEADER_LENGTH:
        return None
    return value
