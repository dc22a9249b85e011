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
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules

from switchboard_todos import validation

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
