"""The title of a message sent over SQS: the task it runs, when a task queue sent it.

Celery (kombu's SQS transport) and dramatiq-sqs send base64 of a JSON envelope, which the
admin shows as an opaque payload. The task's name in it (Celery's `headers.task`, dramatiq's
`actor_name`) becomes the todo's title, which an operator reads in the list and searches for.
A body that is neither gives no title; the body itself is always kept as it was sent.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from switchboard_todos.validation import TITLE_MAX_LENGTH

#: Larger bodies are not read for a title (a task's arguments can be large; its name is short).
MAX_READ = 256 * 1024


def title_of(body: str) -> str:
    """The task name in a Celery or dramatiq message's body, or ""."""
    if len(body) > MAX_READ:
        return ""
    envelope = _object(body) or _object(_unbase64(body))
    if envelope is None:
        return ""
    headers = envelope.get("headers")
    task = headers.get("task") if isinstance(headers, dict) else None  # Celery, protocol 2
    if not isinstance(task, str) and isinstance(envelope.get("message_id"), str):
        task = envelope.get("actor_name")  # dramatiq
    return task[:TITLE_MAX_LENGTH] if isinstance(task, str) else ""


def _unbase64(body: str) -> str:
    try:
        return base64.b64decode(body, validate=True).decode()
    except (binascii.Error, ValueError):  # not base64, or not UTF-8 (a ValueError)
        return ""


def _object(text: str) -> dict[str, Any] | None:
    if not text.startswith("{"):
        return None
    try:
        found = json.loads(text)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None
