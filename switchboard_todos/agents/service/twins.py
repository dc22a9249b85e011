"""The `a`-prefixed async twins of the service's verbs, for the async surfaces (MCP, ASGI)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async

P = ParamSpec("P")
R = TypeVar("R")


def twin(function: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    """The `a`-prefixed twin of a service function: the same code, run off the event loop."""

    async def async_twin(*args: P.args, **kwargs: P.kwargs) -> R:
        return await sync_to_async(function, thread_sensitive=True)(*args, **kwargs)

    async_twin.__name__ = async_twin.__qualname__ = f"a{function.__name__}"
    async_twin.__doc__ = f"Async twin of `{function.__name__}`."
    return async_twin
