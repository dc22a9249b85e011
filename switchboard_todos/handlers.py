"""Which function runs a todo of a given kind: a registry filled by the `@handler` decorator.

Put handlers in a `todo_handlers.py` module of any installed app; `autodiscover()` (called by
the worker at start) imports them all, as the admin does with `admin.py`.

    from switchboard_todos.handlers import handler

    @handler("github.push")
    def summarise_push(todo):
        return {"commits": len(todo.payload["commits"])}

A handler receives the claimed `Todo` and returns the JSON result stored by `complete`; an
exception fails the attempt (retried with backoff, dead-lettered at `max_attempts`). Todos are
delivered at least once, so a handler must be safe to run twice for the same todo. A handler
may be a coroutine function (`async def`); the worker runs it to completion on its thread.

While it runs, a handler may call `report_progress(note)` (sent with the todo's next heartbeat)
and `todo_cancelled()` (whether an operator cancelled the todo: stop and return):

    @handler("reports.build")
    def build(todo):
        for number, part in enumerate(parts(todo), 1):
            report_progress({"parts done": number})  # raises TodoCancelled once cancelled
            render(part)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextvars import ContextVar
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules

from switchboard_todos import validation
from switchboard_todos.exceptions import TodoCancelled

if TYPE_CHECKING:
    from switchboard_todos.models import Todo

Handler = Callable[["Todo"], Any]
H = TypeVar("H", bound=Handler)

#: The `source` of the todos enqueued through django.tasks (`backends.TodoBackend`); the worker
#: runs them by their task's module path, `kind`, not through this registry.
TASKS_SOURCE = "django.tasks"

_registry: dict[str, Handler] = {}
_timeouts: dict[str, float] = {}


def handler(kind: str, *, timeout: float | timedelta | None = None) -> Callable[[H], H]:
    """Register the decorated function as the handler of todos of `kind`.

    `timeout` (seconds) bounds one run: past it the worker fails the attempt (retried, and
    dead-lettered at `max_attempts`) and abandons the thread; it overrides the worker's
    `--timeout`.
    """
    checked = validation.kind(kind)
    if not checked:
        raise ImproperlyConfigured("A handler needs a non-empty kind.")
    seconds = None if timeout is None else validation.handler_timeout(timeout)

    def register(function: H) -> H:
        registered = _registry.get(checked)
        if registered is not None and registered is not function:
            raise ImproperlyConfigured(
                f"Kind {checked!r} already has a handler, "
                f"{registered.__module__}.{registered.__qualname__}."
            )
        _registry[checked] = function
        if seconds is None:
            _timeouts.pop(checked, None)
        else:
            _timeouts[checked] = seconds
        return function

    return register


def get_handler(kind: str) -> Handler | None:
    """The handler registered for `kind`, or None."""
    return _registry.get(kind)


def kind_of(function: Handler) -> str | None:
    """The kind `function` is registered as the handler of, or None."""
    return next((kind for kind, known in _registry.items() if known is function), None)


def get_timeout(kind: str) -> float | None:
    """The `timeout` the handler of `kind` was registered with, or None."""
    return _timeouts.get(kind)


def autodiscover() -> None:
    """Import the `todo_handlers` module of every installed app that has one."""
    autodiscover_modules("todo_handlers")


class Running:
    """What the worker and the handler running one todo share: whether an operator cancelled
    the todo (the worker learns it at a heartbeat), and the handler's latest progress note."""

    __slots__ = ("todo_id", "cancelled", "progress")

    def __init__(self, todo_id: str) -> None:
        self.todo_id = todo_id
        self.cancelled = False
        #: The latest note, as JSON will store it (a snapshot: the handler may change its own).
        self.progress: Any = None


#: The todo the handler on this thread (or in this coroutine) runs. A context variable rather
#: than a thread-local, so that it reaches a coroutine handler run through async_to_sync.
_running: ContextVar[Running | None] = ContextVar("switchboard_todos_running", default=None)


class running:
    """Run a handler with `todo` as what `todo_cancelled` and `report_progress` speak of.

    A class rather than a @contextmanager generator, which cost the worker more per todo than
    the rest of its bookkeeping around a quick handler.
    """

    __slots__ = ("_todo", "_token")

    def __init__(self, todo: Running) -> None:
        self._todo = todo

    def __enter__(self) -> None:
        self._token = _running.set(self._todo)

    def __exit__(self, *exc_info: object) -> None:
        _running.reset(self._token)


def todo_cancelled() -> bool:
    """Whether an operator cancelled the todo this handler runs: then stop work and return.

    The worker learns it at the todo's next heartbeat (every third of the lease), stops waiting
    for the handler and drops its outcome. False outside a worker's handler.
    """
    todo = _running.get()
    return todo is not None and todo.cancelled


def report_progress(note: Any) -> None:
    """Keep `note` as the latest progress note of the todo this handler runs.

    Any JSON value of at most SWITCHBOARD_TODOS_MAX_PROGRESS_BYTES (InvalidTodo otherwise);
    the worker stores it with the todo's next heartbeat, for the admin and the agents to read.
    Raises TodoCancelled once an operator cancelled the todo: the place to stop. Outside a
    worker's handler it checks the note and does nothing more.
    """
    text = validation.progress(note)
    todo = _running.get()
    if todo is None:
        return
    if todo.cancelled:
        raise TodoCancelled(
            f"Todo {todo.todo_id} was cancelled by an operator: stop work on it.",
            todo_id=todo.todo_id,
        )
    if text is not None:
        todo.progress = json.loads(text)
