"""OpenTelemetry tracing of todos (the `otel` extra, docs/operating.md): spans of their
creates, claims, handler runs and settlements, after OpenTelemetry's messaging conventions, and
the creator's trace context stored with each todo, so that all of them join the creator's trace.

`opentelemetry-api` is optional, and this module never imports it first: a program that traces
has imported it already (to set a tracer provider, or through an instrumentation). Until then
each function here costs a lookup in `sys.modules`; with the API loaded but no tracer provider
set, a call more, and no span is made. A context that is active without one (a remote caller's,
say) is still stored with the todos created under it, for whoever traces their handling.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanContext, Tracer

    from switchboard_todos.models import Todo

#: messaging.system of every span: the queue is this app's own.
SYSTEM = "switchboard_todos"
#: The instrumentation scope of the spans.
TRACER_NAME = "switchboard_todos"
#: The module whose presence says that a program uses OpenTelemetry: every part of the API
#: (trace, propagate, baggage) imports it.
_LOADED = "opentelemetry.context"
#: The global tracer provider last seen, and this module's tracer of it (None: a proxy, no
#: provider set). Read and replaced whole, one tuple: threads see one pair or the other.
_seen: tuple[Any, Tracer | None] = (None, None)
_HEX32, _HEX16, _HEX2 = (re.compile(f"[0-9a-f]{{{n}}}") for n in (32, 16, 2))


def tracer() -> Tracer | None:
    """This module's tracer, or None when no tracer provider is set (or no OpenTelemetry)."""
    global _seen
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    seen = _seen
    if provider is not seen[0]:
        traced = not isinstance(provider, trace.ProxyTracerProvider)
        seen = _seen = (provider, provider.get_tracer(TRACER_NAME) if traced else None)
    return seen[1]


def started() -> int | None:
    """The start time (ns) of a claim or settlement about to run, when it is to be a span."""
    return None if tracer() is None else time.time_ns()


# The trace context stored with a todo


def current_context() -> str | None:
    """The active trace context as a todo stores it (the headers of the global propagators,
    W3C traceparent, tracestate and baggage by default, as a JSON object), or None."""
    if _LOADED not in sys.modules:
        return None
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return json.dumps(carrier, separators=(",", ":"), sort_keys=True) if carrier else None


def stored_context(stored: str | None) -> Context | None:
    """The context of a todo's stored trace context; None without one (or OpenTelemetry)."""
    if stored is None or _LOADED not in sys.modules:
        return None
    from opentelemetry import propagate

    try:
        carrier = json.loads(stored)
    except ValueError:
        return None
    if not isinstance(carrier, dict):
        return None
    return propagate.extract(carrier)


def traceparent(stored: str | None) -> tuple[str, str, str] | None:
    """The trace id (32 hex digits), parent span id (16) and flags (2) of a todo's stored
    trace context, read without OpenTelemetry (the admin and SQS show them), or None."""
    if not stored:
        return None
    try:
        carrier = json.loads(stored)
        _version, found, span, flags = carrier["traceparent"].split("-")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not (_HEX32.fullmatch(found) and _HEX16.fullmatch(span) and _HEX2.fullmatch(flags)):
        return None
    return (found, span, flags) if found.strip("0") and span.strip("0") else None


def trace_id(stored: str | None) -> str | None:
    """The trace id (32 hex digits) of a todo's stored trace context, or None."""
    found = traceparent(stored)
    return None if found is None else found[0]


def _span_context(stored: str | None) -> SpanContext | None:
    """The creating span of a todo's stored trace context, when it has a valid one."""
    context = stored_context(stored)
    if context is None:
        return None
    from opentelemetry import trace

    found = trace.get_current_span(context).get_span_context()
    return found if found.is_valid else None


# Creates


class Creation:
    """A create's trace context, to store with its todos, and its span (when one is made)."""

    __slots__ = ("context", "span")

    def __init__(self, context: str | None, span: Span | None) -> None:
        self.context = context
        self.span = span

    def created(self, todo_id: str) -> None:
        """Name the todo a create of one made (messaging.message.id)."""
        if self.span is not None:
            self.span.set_attribute("messaging.message.id", todo_id)


_UNTRACED = Creation(None, None)


def creating(
    operation: str, queues: Collection[str], count: int
) -> AbstractContextManager[Creation]:
    """The span of a create of `count` todos in `queues` (operation type create, a producer's),
    current while the statement runs, and the trace context the todos store: the span's, or
    without a tracer provider whatever context is active. Nothing, without OpenTelemetry."""
    if _LOADED not in sys.modules:
        return nullcontext(_UNTRACED)
    return _creating(operation, queues, count)


@contextmanager
def _creating(operation: str, queues: Collection[str], count: int) -> Iterator[Creation]:
    traced = tracer()
    if traced is None:
        yield Creation(current_context(), None)
        return
    from opentelemetry.trace import SpanKind

    name, attributes = _named(operation, "create", queues, count)
    with traced.start_as_current_span(name, kind=SpanKind.PRODUCER, attributes=attributes) as span:
        yield Creation(current_context(), span)


# Remote creators


def remote(headers: Mapping[str, str]) -> AbstractContextManager[None]:
    """The trace context a remote caller sent (`headers`: W3C traceparent and baggage) made
    current, unless a span is current already (an instrumentation's, which took it)."""
    if _LOADED not in sys.modules or "traceparent" not in headers:
        return nullcontext()
    return _remote(headers)


@contextmanager
def _remote(headers: Mapping[str, str]) -> Iterator[None]:
    from opentelemetry import context, propagate, trace

    if trace.get_current_span().get_span_context().is_valid:
        yield
        return
    carrier = {
        name: headers[name] for name in ("traceparent", "tracestate", "baggage") if name in headers
    }
    extracted = propagate.extract(carrier)
    if not trace.get_current_span(extracted).get_span_context().is_valid:
        yield  # malformed: ignored, as W3C Trace Context says
        return
    token = context.attach(extracted)
    try:
        yield
    finally:
        context.detach(token)


# Claims, handler runs, settlements


def received(started: int, operation: str, todos: list[Todo], owner: str) -> None:
    """The span of a claim that took `todos` (receive, a client's), from `started` to now:
    linked to the creating span of each."""
    if todos:
        _record(started, operation, "receive", todos, owner)


def settled(started: int, operation: str, todos: list[Todo], owner: str) -> None:
    """The span of a settlement of `todos` (complete, fail, release: settle), from `started`
    to now: a child of the current span, else of one todo's creating span; linked to each's."""
    if todos:
        _record(started, operation, "settle", todos, owner)


def _record(started: int, operation: str, kind: str, todos: list[Todo], owner: str) -> None:
    traced = tracer()
    if traced is None:
        return
    from opentelemetry import trace

    name, attributes = _named(operation, kind, {todo.queue for todo in todos}, len(todos))
    attributes["messaging.client.id"] = owner
    if len(todos) == 1:
        attributes["messaging.message.id"] = todos[0].id
    creators = [found for found in map(_span_context, (t.trace_context for t in todos)) if found]
    parent = None
    if kind == "settle" and len(todos) == 1 and not _current_is_valid():
        parent = stored_context(todos[0].trace_context)
    span = traced.start_span(
        name,
        context=parent,
        kind=trace.SpanKind.CLIENT,
        attributes=attributes,
        links=[trace.Link(creator) for creator in creators],
        start_time=started,
    )
    span.end()


@contextmanager
def processing(traced: Tracer, todo: Todo) -> Iterator[Span]:
    """The span of `todo`'s handler run (process, a consumer's) made by `traced` (`tracer()`,
    which the worker asks once per batch it claims), current while it runs: a child of the
    todo's creating span, with the creator's baggage."""
    from opentelemetry import context
    from opentelemetry.trace import SpanKind

    name, attributes = _named("process", "process", (todo.queue,), 1)
    attributes["messaging.message.id"] = todo.id
    attributes["messaging.switchboard_todos.attempt"] = todo.attempt  # this run's, from 1
    parent = stored_context(todo.trace_context)
    token = None if parent is None else context.attach(parent)
    try:
        with traced.start_as_current_span(
            name,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span
    finally:
        if token is not None:
            context.detach(token)


def failed(span: Span | None, error: BaseException) -> None:
    """Mark a handler run's span (`processing`) failed with `error`."""
    if span is None:
        return
    from opentelemetry.trace import StatusCode

    span.record_exception(error)
    span.set_status(StatusCode.ERROR, type(error).__name__)
    span.set_attribute("error.type", type(error).__qualname__)


def _current_is_valid() -> bool:
    from opentelemetry import trace

    return bool(trace.get_current_span().get_span_context().is_valid)


def _named(
    operation: str, kind: str, queues: Collection[str], count: int
) -> tuple[str, dict[str, Any]]:
    """A span's name and messaging attributes: "<operation> <queue>" when its todos are of one
    queue (messaging.destination.name), "<operation>" otherwise."""
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": kind,
        "messaging.operation.name": operation,
    }
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    if len(queues) == 1:
        [queue] = queues
        attributes["messaging.destination.name"] = queue
        return f"{operation} {queue}", attributes
    return operation, attributes
