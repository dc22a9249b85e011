"""The SQS endpoint: the AWS JSON 1.0 protocol over the agents' service layer.

`POST <base>/sqs/` with `X-Amz-Target: AmazonSQS.<Action>` and a JSON body, signed with SigV4
(signing.py), or at any path behind `SQSAnywhere` (mount.py); queue URLs are the endpoint's URL
and the queue's name (queue_urls.py). Each action authenticates the agent, is counted among
its requests in flight (agents/request_cap.py), calls agents/service/ (which checks the
grants), and answers SQS's JSON; errors come from the one error table (agents/errors.py) in
SQS's shape, with the `x-amzn-query-error` header botocore reads the legacy error codes from.
The long poll of ReceiveMessage waits on the LISTEN path without holding a thread under ASGI,
and ends, claiming nothing, when its client goes away.

Every parameter is checked before the first statement runs, so a refused request writes and
claims nothing; the answer of a send is computed before its todo is written, and a received
batch that cannot be answered, or whose client went away (agents/disconnects.py), is given back
(its attempts refunded), never left claimed.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError
from django.db.models import prefetch_related_objects
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from switchboard_todos import faults, tracing, validation
from switchboard_todos.agents import errors, request_cap, serialize, service
from switchboard_todos.exceptions import InvalidTodo, QueueNotGranted, TodoError
from switchboard_todos.models import Agent, Todo, known_history
from switchboard_todos.sqs import attributes, messages, queue_urls, signing, titles

logger = logging.getLogger("switchboard_todos.sqs")

CONTENT_TYPE = "application/x-amz-json-1.0"
#: Most entries in a batch, as SQS.
MAX_BATCH = 10
#: A MessageGroupId, as SQS takes it: 1 to 128 letters, digits and punctuation.
_MESSAGE_GROUP = re.compile(r"[\x21-\x7e]{1,128}")
#: The legacy (query protocol) code of each error, as SQS sends it in x-amzn-query-error.
LEGACY_CODES = {
    "QueueDoesNotExist": "AWS.SimpleQueueService.NonExistentQueue",
    "UnsupportedOperation": "AWS.SimpleQueueService.UnsupportedOperation",
    "TooManyEntriesInBatchRequest": "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
    "EmptyBatchRequest": "AWS.SimpleQueueService.EmptyBatchRequest",
    "BatchEntryIdsNotDistinct": "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
}
#: Why an action a client may count on is not here: the client's user reads it in its error.
WHY_UNSUPPORTED = {
    "CreateQueue": (
        ": a queue exists when an operator grants it to agents, so a client that makes queues "
        "as it goes (Celery's remote control, `celery inspect` and `celery control`, makes "
        "reply queues) does not work here"
    ),
}
#: HTTP status of the errors that are not the caller's input.
STATUS = {
    "InvalidClientTokenId": 403,
    "SignatureDoesNotMatch": 403,
    "IncompleteSignature": 403,
    "MissingAuthenticationToken": 403,
    "AccessDenied": 403,
    # As SQS, and as botocore's retry rules expect it (a throttled request is retried).
    "RequestThrottled": 403,
    "ServiceUnavailable": 503,
    "InternalFailure": 500,
}


class SQSError(Exception):
    """An SQS error answer: its code and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


Action = Callable[[Agent, dict[str, Any], HttpRequest], Awaitable[dict[str, Any]]]


@csrf_exempt
async def endpoint(request: HttpRequest, queue: str | None = None) -> HttpResponse:
    """Every action, at the endpoint URL and at each queue URL."""
    try:
        action = _action(request)
        body = request.body
        if len(body) > MAX_BODY:
            return body_too_large()
        agent, params = await sync_to_async(_signed)(request, body, action in RECOGNISED)
        with request_cap.admitted(agent):  # past the agent's cap, RequestThrottled
            return _answer(200, await action(agent, params, request))
    except signing.SigningError as error:
        return _error(error.code, str(error))
    except SQSError as error:
        return _error(error.code, str(error))
    except TodoError as error:
        return _error(errors.kind_of(error).sqs, str(error))
    except RequestDataTooBig:
        return _error("InvalidParameterValue", "The request body is too large.")
    except Exception as error:
        if isinstance(error, DatabaseError) and faults.is_outage(error):
            return _error("ServiceUnavailable", "The database is unavailable; retry later.")
        logger.exception("SQS %s failed", request.headers.get("X-Amz-Target"))
        return _error("InternalFailure", "The request failed on the server.")


def _action(request: HttpRequest) -> Action:
    target = request.headers.get("X-Amz-Target", "")
    if request.method != "POST" or not target.startswith("AmazonSQS."):
        raise SQSError(
            "InvalidAction", "Send POST with X-Amz-Target: AmazonSQS.<Action> (AWS JSON 1.0)."
        )
    name = target.removeprefix("AmazonSQS.")
    action = ACTIONS.get(name)
    if action is None:
        raise SQSError(
            "UnsupportedOperation",
            f"{name} is not supported here{WHY_UNSUPPORTED.get(name, '')}; "
            f"supported: {', '.join(sorted(ACTIONS))}.",
        )
    return action


def _signed(request: HttpRequest, body: bytes, recognised: bool) -> tuple[Agent, dict[str, Any]]:
    """On a thread: the agent that signed the request (`recognised`: as read lately, for the
    actions in RECOGNISED), then its parameters, parsed only for a signed request and never on
    the event loop."""
    agent = signing.verify(
        method=request.method or "POST",
        url=request.build_absolute_uri(),
        headers=dict(request.headers),
        body=body,
        recognised=recognised,
    )
    return agent, _params(body)


def _params(body: bytes) -> dict[str, Any]:
    try:
        params = json.loads(body or b"{}")
    except (ValueError, RecursionError):
        raise SQSError("InvalidParameterValue", "The request body is not JSON.") from None
    if not isinstance(params, dict):
        raise SQSError("InvalidParameterValue", "The request body must be a JSON object.")
    return params


def _answer(status: int, content: dict[str, Any]) -> HttpResponse:
    return HttpResponse(json.dumps(content), status=status, content_type=CONTENT_TYPE)


#: Most bytes a request body may have (SQS: a 256 KiB message, and a batch of ten).
MAX_BODY = 1024 * 1024


def body_too_large() -> HttpResponse:
    """The answer to a body past MAX_BODY, as SQS words it."""
    return _error("InvalidParameterValue", f"The request body exceeds {MAX_BODY} bytes.")


def _error(code: str, message: str) -> HttpResponse:
    status = STATUS.get(code, 400)
    response = _answer(status, {"__type": f"com.amazonaws.sqs#{code}", "message": message})
    fault = "Receiver" if status >= 500 else "Sender"
    response["x-amzn-query-error"] = f"{LEGACY_CODES.get(code, code)};{fault}"
    return response


# Queues


def _queue(params: dict[str, Any], *, name_field: str = "QueueUrl") -> str:
    """The queue a QueueUrl (or QueueName) names."""
    value = params.get(name_field)
    if not isinstance(value, str) or not value:
        raise SQSError("MissingParameter", f"The request must contain the parameter {name_field}.")
    name = queue_urls.name_in(value) if name_field == "QueueUrl" else value
    try:
        return validation.queue(name)
    except InvalidTodo:
        raise SQSError(
            "QueueDoesNotExist", f"The specified queue {name!r} does not exist."
        ) from None


def _granted(agent: Agent) -> list[str]:
    return sorted(set(agent.claim_queues) | set(agent.create_queues))


def _check_granted(agent: Agent, queue: str, grant: list[str]) -> None:
    if queue not in grant:
        raise QueueNotGranted(f"Agent {agent.name!r} is not granted queue {queue!r} for this.")


async def get_queue_url(
    agent: Agent, params: dict[str, Any], request: HttpRequest
) -> dict[str, Any]:
    queue = _queue(params, name_field="QueueName")
    _check_granted(agent, queue, _granted(agent))
    return {"QueueUrl": queue_urls.queue_url(request, queue)}


async def list_queues(agent: Agent, params: dict[str, Any], request: HttpRequest) -> dict[str, Any]:
    prefix = params.get("QueueNamePrefix") or ""
    if not isinstance(prefix, str):
        raise SQSError("InvalidParameterValue", "QueueNamePrefix must be a string.")
    names = [name for name in _granted(agent) if name.startswith(prefix)]
    return {"QueueUrls": [queue_urls.queue_url(request, name) for name in names]}


async def get_queue_attributes(
    agent: Agent, params: dict[str, Any], request: HttpRequest
) -> dict[str, Any]:
    queue = _queue(params)
    _check_granted(agent, queue, _granted(agent))
    wanted = _names(params, "AttributeNames") or {"All"}
    found = await sync_to_async(attributes.of)(queue)
    if "All" not in wanted:
        found = {name: value for name, value in found.items() if name in wanted}
    return {"Attributes": found}


# Sending


async def send_message(
    agent: Agent, params: dict[str, Any], request: HttpRequest
) -> dict[str, Any]:
    queue = _queue(params)
    return await sync_to_async(_send)(agent, queue, params)


def _send(agent: Agent, queue: str, entry: dict[str, Any]) -> dict[str, Any]:
    """Check everything, compute the answer, then write: nothing can fail after the todo is."""
    body = entry.get("MessageBody")
    if not isinstance(body, str) or not body:
        raise SQSError("MissingParameter", "The request must contain the parameter MessageBody.")
    validation.text(body, "MessageBody", messages.MAX_VALUE_LENGTH)
    attributes = messages.checked_attributes(entry.get("MessageAttributes") or {})
    delay = entry.get("DelaySeconds", 0)
    if type(delay) is not int or not 0 <= delay <= 900:
        raise SQSError("InvalidParameterValue", "DelaySeconds must be from 0 to 900.")
    group = entry.get("MessageGroupId")
    if group is not None and not (isinstance(group, str) and _MESSAGE_GROUP.fullmatch(group)):
        raise SQSError(
            "InvalidParameterValue",
            "MessageGroupId must be 1 to 128 letters, digits or punctuation.",
        )
    answer = {"MD5OfMessageBody": messages.md5_of_body(body)}
    if attributes:
        answer["MD5OfMessageAttributes"] = messages.md5_of_attributes(attributes)
    with tracing.remote(messages.trace_carrier(entry)):
        todo, _created = service.create_for(
            agent,
            queue=queue,
            kind=messages.KIND,
            title=titles.title_of(body),
            payload={"body": body, "attributes": attributes},
            idempotency_key=entry.get("MessageDeduplicationId"),
            # Its tenant, as in SQS's fair queues: the groups of a queue take turns at its
            # receives.
            fair_key=group,
            run_after=timezone.now() + timedelta(seconds=delay) if delay else None,
        )
    return {"MessageId": todo.id, **answer}


async def send_message_batch(
    agent: Agent, params: dict[str, Any], request: HttpRequest
) -> dict[str, Any]:
    run = _batch(params, lambda entry, queue: _send(agent, queue, entry))
    return await sync_to_async(run)()


def _entries(params: dict[str, Any]) -> list[dict[str, Any]]:
    entries = params.get("Entries")
    if not isinstance(entries, list) or not entries:
        raise SQSError("EmptyBatchRequest", "There should be at least one entry in the request.")
    if len(entries) > MAX_BATCH:
        raise SQSError(
            "TooManyEntriesInBatchRequest",
            f"Maximum number of entries per request are {MAX_BATCH}.",
        )
    if not all(isinstance(entry, dict) and isinstance(entry.get("Id"), str) for entry in entries):
        raise SQSError("InvalidBatchEntryId", "Each entry needs an Id.")
    if len({entry["Id"] for entry in entries}) != len(entries):
        raise SQSError("BatchEntryIdsNotDistinct", "Two or more batch entries have the same Id.")
    return entries


def _failure(entry_id: str, error: Exception) -> dict[str, Any]:
    code = error.code if isinstance(error, SQSError) else errors.kind_of(error).sqs  # type: ignore[arg-type]
    return {"Id": entry_id, "SenderFault": True, "Code": code, "Message": str(error)}


# Receiving


async def receive_message(
    agent: Agent, params: dict[str, Any], request: HttpRequest
) -> dict[str, Any]:
    queue = _queue(params)
    limit = _number(params, "MaxNumberOfMessages", 1, 1, MAX_BATCH)
    # Without one, the queue's visibility timeout (its Queue row, else DEFAULT_TTL).
    visibility = (
        _number(params, "VisibilityTimeout", 0, 0, 43200) if "VisibilityTimeout" in params else None
    )
    wait = _number(params, "WaitTimeSeconds", 0, 0, service.MAX_WAIT)
    wanted = _names(params, "MessageSystemAttributeNames") | _names(params, "AttributeNames")
    attribute_names = _names(params, "MessageAttributeNames")
    todos = await service.aclaim(
        agent,
        queues=[queue],
        ttl=None if visibility is None else max(visibility, 1),
        wait=wait,
        limit=limit,
    )
    return await service.handing_over(
        agent, todos, _messages(agent, todos, wanted, attribute_names)
    )


def _names(params: dict[str, Any], name: str) -> set[str]:
    """A parameter that lists names (of attributes), absent or a list of strs."""
    value = params.get(name) or []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise SQSError("InvalidParameterValue", f"{name} must be a list of names.")
    return set(value)


async def _messages(
    agent: Agent, todos: list[Todo], wanted: set[str], attribute_names: set[str]
) -> dict[str, Any]:
    """The claimed todos as messages. Rendering cannot fail on what a todo holds; if it fails
    all the same, the batch is given back by `service.handing_over` (attempts refunded) rather
    than left claimed."""
    unknown = [todo for todo in todos if known_history(todo) is None]
    if unknown and wanted & {"All", "ApproximateFirstReceiveTimestamp"}:
        # Their failure histories, in one query (_first_claim reads them).
        await sync_to_async(prefetch_related_objects)(unknown, "error_entries")
    return {"Messages": [_message(todo, wanted, attribute_names) for todo in todos]}


def _number(params: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = params.get(name, default)
    if type(value) is not int or not low <= value <= high:
        raise SQSError("InvalidParameterValue", f"{name} must be from {low} to {high}.")
    return value


def _message(todo: Todo, wanted: set[str], attribute_names: set[str]) -> dict[str, Any]:
    body = messages.body_of(todo)
    message: dict[str, Any] = {
        "MessageId": todo.id,
        "ReceiptHandle": messages.receipt_for(todo),
        "MD5OfBody": messages.md5_of_body(body),
        "Body": body,
    }
    chosen = {
        name: value(todo)
        for name, value in SYSTEM_ATTRIBUTES.items()
        if "All" in wanted or name in wanted
    }
    # The group the sender gave (SQS fair queues): none for the agent's own default.
    group = None if todo.fair_key == todo.source else serialize.key_as_given(todo, todo.fair_key)
    if group is not None and ("All" in wanted or "MessageGroupId" in wanted):
        chosen["MessageGroupId"] = group
    # The sender's trace (its AWSTraceHeader or traceparent), when it sent one.
    if todo.trace_context is not None and ("All" in wanted or "AWSTraceHeader" in wanted):
        header = messages.xray_header(todo.trace_context)
        if header is not None:
            chosen["AWSTraceHeader"] = header
    if chosen:
        message["Attributes"] = chosen
    attributes = messages.attributes_of(todo)
    if attributes and attribute_names:
        if not {"All", ".*"} & attribute_names:
            attributes = {
                name: value for name, value in attributes.items() if name in attribute_names
            }
        if attributes:
            message["MessageAttributes"] = attributes
            message["MD5OfMessageAttributes"] = messages.md5_of_attributes(attributes)
    return message


def _first_claim(todo: Todo) -> datetime | None:
    """When the todo was first received: its failure history's first claim, else this one."""
    history = todo.errors
    first = history[0] if history else None
    moment = first.get("claimed_at") if isinstance(first, dict) else None
    try:
        return datetime.fromisoformat(moment) if isinstance(moment, str) else todo.claimed_at
    except ValueError:
        return todo.claimed_at


def _millis(moment: datetime | None) -> int:
    return int(moment.timestamp() * 1000) if moment is not None else 0


#: A message's system attributes, each worked out only when asked for: the first receive's is
#: read from the failure history (prefetched by `_messages`).
SYSTEM_ATTRIBUTES: dict[str, Callable[[Todo], str]] = {
    "ApproximateReceiveCount": lambda todo: str(todo.attempt),
    "SentTimestamp": lambda todo: str(_millis(todo.created_at)),
    "ApproximateFirstReceiveTimestamp": lambda todo: str(_millis(_first_claim(todo))),
}


# The holder's verbs


def _handle(handle: object) -> messages.Handle:
    """The todo and receipt `handle` names, or ReceiptHandleIsInvalid."""
    named = messages.read_receipt(handle)
    if named is None:
        raise SQSError("ReceiptHandleIsInvalid", f"The receipt handle {handle!r:.60} is not valid.")
    return named


def _delete(agent: Agent, handle: object) -> None:
    """One statement: the complete of the todo, guarded by the receipt (a handle from an
    earlier receipt of the same message acts on nothing: ReceiptHandleIsInvalid)."""
    named = _handle(handle)
    service.complete(agent, named.todo_id, receipt=named.receipt)


def _change_visibility(agent: Agent, handle: object, timeout: object) -> None:
    """One statement: a release (0) or a heartbeat, guarded by the receipt."""
    if type(timeout) is not int or not 0 <= timeout <= 43200:
        raise SQSError("InvalidParameterValue", "VisibilityTimeout must be from 0 to 43200.")
    named = _handle(handle)
    if timeout == 0:
        service.release(agent, named.todo_id, receipt=named.receipt)
    else:
        service.heartbeat(agent, named.todo_id, timeout, receipt=named.receipt)


async def delete_message(
    agent: Agent, params: dict[str, Any], request: HttpRequest
) -> dict[str, Any]:
    _queue(params)
    await sync_to_async(_delete)(agent, params.get("ReceiptHandle"))
    return {}


async def change_message_visibility(
    agent: Agent, params: dict[str, Any], request: HttpRequest
) -> dict[str, Any]:
    _queue(params)
    await sync_to_async(_change_visibility)(
        agent, params.get("ReceiptHandle"), params.get("VisibilityTimeout")
    )
    return {}


def _batch(
    params: dict[str, Any], each: Callable[[dict[str, Any], str], dict[str, Any] | None]
) -> Callable[[], dict[str, Any]]:
    """A batch action: `each(entry, queue)` per entry, its answer's fields (if any) beside the
    entry's Id in Successful, or its error in Failed."""
    queue = _queue(params)
    entries = _entries(params)

    def run() -> dict[str, Any]:
        successful, failed = [], []
        for entry in entries:
            try:
                successful.append({"Id": entry["Id"], **(each(entry, queue) or {})})
            except (SQSError, TodoError) as error:
                failed.append(_failure(entry["Id"], error))
        return {"Successful": successful, "Failed": failed}

    return run


async def delete_message_batch(
    agent: Agent, params: dict[str, Any], request: HttpRequest
) -> dict[str, Any]:
    run = _batch(params, lambda entry, queue: _delete(agent, entry.get("ReceiptHandle")))
    return await sync_to_async(run)()


async def change_message_visibility_batch(
    agent: Agent, params: dict[str, Any], request: HttpRequest
) -> dict[str, Any]:
    run = _batch(
        params,
        lambda entry, queue: _change_visibility(
            agent, entry.get("ReceiptHandle"), entry.get("VisibilityTimeout")
        ),
    )
    return await sync_to_async(run)()


async def purge_queue(agent: Agent, params: dict[str, Any], request: HttpRequest) -> dict[str, Any]:
    """Operators purge (the admin, `purge_todos`); an agent may not."""
    queue = _queue(params)
    raise SQSError(
        "AccessDenied",
        f"PurgeQueue is an operator's action: agent {agent.name!r} may not purge {queue!r}. "
        "Operators delete todos in the admin or with manage.py purge_todos.",
    )


ACTIONS: dict[str, Action] = {
    "GetQueueUrl": get_queue_url,
    "ListQueues": list_queues,
    "GetQueueAttributes": get_queue_attributes,
    "SendMessage": send_message,
    "SendMessageBatch": send_message_batch,
    "ReceiveMessage": receive_message,
    "DeleteMessage": delete_message,
    "DeleteMessageBatch": delete_message_batch,
    "ChangeMessageVisibility": change_message_visibility,
    "ChangeMessageVisibilityBatch": change_message_visibility_batch,
    "PurgeQueue": purge_queue,
}
#: The actions whose statements check the agent's credential themselves (the claim, and the
#: holder's verbs): their agent is recognised (agents/service/identity.py), one statement
#: fewer a request. The others read the agent's grants and are answered from them: the agent
#: is read anew for each.
RECOGNISED = {
    receive_message,
    delete_message,
    delete_message_batch,
    change_message_visibility,
    change_message_visibility_batch,
}
