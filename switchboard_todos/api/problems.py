"""Everything that goes wrong, as an RFC 9457 problem: from the one error table, never a 500.

The body parser turns what an agent can send wrong (not JSON, too large, nested too deep, text
that is not text) into typed errors before any view runs; the handlers turn every exception
into application/problem+json with the status of agents/errors.py.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseNotAllowed
from django.urls import URLPattern
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser

from switchboard_todos import faults
from switchboard_todos.agents import errors
from switchboard_todos.agents.errors import ErrorKind
from switchboard_todos.exceptions import InvalidTodo, NotAuthenticated, Throttled, TodoError

logger = logging.getLogger(__name__)

CONTENT_TYPE = "application/problem+json"
#: How deep a request body may nest arrays and objects.
MAX_DEPTH = 100
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class JSONBody(Parser):
    """Parse a request body as JSON, refusing what PostgreSQL or the core could not take.

    Larger than DATA_UPLOAD_MAX_MEMORY_SIZE is a 413 (Django raises RequestDataTooBig); not
    JSON, deeper than MAX_DEPTH or with an unpaired surrogate (`"\\ud800"`: valid JSON, but
    not text any database can store) is a 422.
    """

    def parse_body(self, request: HttpRequest) -> dict[str, Any]:
        return parse_json(request.body)


def parse_json(body: bytes) -> dict[str, Any]:
    """A request body as a JSON object, or InvalidTodo saying why not (JSONBody)."""
    try:
        data = json.loads(body)
    except RecursionError:
        raise InvalidTodo(f"The body nests deeper than {MAX_DEPTH} levels.") from None
    except ValueError as error:
        raise InvalidTodo(f"The body is not JSON: {error}.") from None
    # Both checks walk the whole body: only when its text says they may find something.
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH or _ESCAPED_SURROGATE.search(body):
        _check_text_and_depth(data)
    if not isinstance(data, dict):
        raise InvalidTodo(f"The body must be a JSON object, not {type(data).__name__}.")
    return data


def _check_text_and_depth(data: Any) -> None:
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InvalidTodo(f"The body nests deeper than {MAX_DEPTH} levels.")
        if isinstance(value, dict):
            stack.extend((key, depth) for key in value)
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, str) and _SURROGATE.search(value):
            raise InvalidTodo(
                "The body holds an unpaired surrogate escape (\\ud800 to \\udfff), which is not "
                "text; escape the characters of the real text instead."
            )


def problem_response(
    kind: ErrorKind, detail: str, *, invalid_token: bool = False, **extensions: Any
) -> HttpResponse:
    """The problem details response of `kind`; `extensions` are more members of the body."""
    body = {**errors.problem(kind, detail), **extensions}
    response = HttpResponse(json.dumps(body), status=kind.status, content_type=CONTENT_TYPE)
    if kind.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="switchboard-todos"' + (
            ', error="invalid_token"' if invalid_token else ""
        )
    return response


def install(api: NinjaAPI) -> None:
    """Make every error `api` can meet a problem response."""
    handlers: list[tuple[type[Exception], Callable[[HttpRequest, Any], HttpResponse]]] = [
        (TodoError, _todo_error),
        (ValidationError, _validation_error),
        (HttpError, _http_error),
        (RequestDataTooBig, _too_large),
        (Exception, _server_error),
    ]
    for exception, handler in handlers:
        api.add_exception_handler(exception, handler)


def _todo_error(request: HttpRequest, error: TodoError) -> HttpResponse:
    return todo_error_response(error, request.headers.get("Authorization", ""))


def todo_error_response(error: TodoError, authorization: str) -> HttpResponse:
    """The problem of a refusal of the core or the service; `authorization` is the header."""
    # RFC 6750: a token that was sent but refused is an invalid_token.
    scheme, _, token = authorization.partition(" ")
    sent = scheme.lower() == "bearer" and bool(token.strip())
    if isinstance(error, Throttled):
        response = problem_response(errors.THROTTLED, str(error), retry_after=error.retry_after)
        response["Retry-After"] = str(error.retry_after)
        return response
    return problem_response(
        errors.kind_of(error),
        str(error),
        invalid_token=isinstance(error, NotAuthenticated) and sent,
    )


def _validation_error(request: HttpRequest, error: ValidationError) -> HttpResponse:
    """pydantic's findings, each as `field: message` in the detail and in the list `errors`.

    ninja locates a finding as (source, parameter, field…): the body's fields are named
    without the first two, the query's and the path's without the first.
    """
    found = []
    for item in error.errors:
        loc = [str(part) for part in item.get("loc", ())]
        found.append((loc[2:] if loc[:1] == ["body"] else loc[1:], item.get("msg", "")))
    return invalid_fields_response(found)


def invalid_fields_response(found: list[tuple[list[str], Any]]) -> HttpResponse:
    """A 422 listing pydantic's findings, each (field path, message), as `field: message`."""
    listed = [
        {"field": ".".join(path) or "body", "message": str(message)} for path, message in found
    ]
    detail = "; ".join(f"{item['field']}: {item['message']}" for item in listed)
    return problem_response(errors.INVALID_INPUT, detail, errors=listed)


def _http_error(request: HttpRequest, error: HttpError) -> HttpResponse:
    cause = error.__cause__
    if isinstance(error, AuthenticationError):
        # No Authorization header, or not a Bearer one: the service never saw a token.
        return problem_response(errors.NOT_AUTHENTICATED, errors.NO_TOKEN)
    if isinstance(cause, TodoError):
        return _todo_error(request, cause)
    # ninja's own refusals of a request it could not read.
    return problem_response(errors.INVALID_INPUT, str(error.message))


def methods_as_problems(route: URLPattern) -> URLPattern:
    """`route`, whose answer to a method it does not take (ninja's plain-text 405) is a
    problem, with the same Allow header."""
    view = route.callback

    def refusal(response: HttpResponseBase) -> HttpResponseBase:
        if not isinstance(response, HttpResponseNotAllowed):
            return response
        problem = problem_response(
            errors.METHOD_NOT_ALLOWED, f"This path takes {response['Allow']} only."
        )
        problem["Allow"] = response["Allow"]
        return problem

    if iscoroutinefunction(view):

        async def answer_async(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            return refusal(await view(request, *args, **kwargs))

        wrapped: Callable[..., Any] = answer_async
    else:

        def answer(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            return refusal(view(request, *args, **kwargs))

        wrapped = answer
    functools.update_wrapper(wrapped, view)  # its csrf_exempt too
    return URLPattern(route.pattern, wrapped, route.default_args, route.name)


def _too_large(request: HttpRequest, error: RequestDataTooBig) -> HttpResponse:
    return too_large_response()


def too_large_response() -> HttpResponse:
    """A body larger than DATA_UPLOAD_MAX_MEMORY_SIZE."""
    return problem_response(errors.BODY_TOO_LARGE, "The request body is too large.")


def _server_error(request: HttpRequest, error: Exception) -> HttpResponse:
    return server_error_response(f"{request.method} {request.path}", error)


def server_error_response(request: str, error: Exception) -> HttpResponse:
    """Our fault, not the agent's: logged with its traceback, answered without it.

    `request` names the request in the log (method and path).
    """
    if faults.is_outage(error):
        logger.warning("Database unavailable for %s: %s", request, error)
        response = problem_response(errors.UNAVAILABLE, "The database is unavailable; retry.")
        response["Retry-After"] = "5"
        return response
    logger.error("Error in %s", request, exc_info=error)
    kind = errors.SERVER_ERROR
    detail = "A database error." if isinstance(error, DatabaseError) else "An internal error."
    return problem_response(kind, f"{detail} It was logged.")
