"""Imported by a `todo_worker --import-module` child: a bug in the worker itself, not in a todo.

Every runner dies at its first todo; the process must then exit non-zero, so that systemd's
Restart=on-failure starts a fresh one.
"""

from __future__ import annotations

from typing import Any

from switchboard_todos.worker.executing import Executor


def _broken(self: Executor, runner: Any, held: Any) -> None:
    raise RuntimeError("a bug in the runner loop")


Executor.execute = _broken  # type: ignore[method-assign]
