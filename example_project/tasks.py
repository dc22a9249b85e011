"""The example's django.tasks tasks: `enqueue()` stores each call as a todo, todo_worker runs it.

The TASKS setting points at `switchboard_todos.backends.TodoBackend`, so these get what todos
get: a lease, retries with backoff, a dead letter after `max_attempts`, the admin's requeue
(docs/tasks.md). `task` comes from `django.tasks` on Django 6.0+, and from `django_tasks` (the
backport) on Django 5.2; a project on one Django version imports from its one package.

    result = count_words.enqueue("the text")
    result.refresh()  # after a worker ran it
    result.status, result.return_value  # SUCCESSFUL, {"words": 2, ...}
"""

from __future__ import annotations

import re
from collections import Counter
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or find_spec("django.tasks") is not None:
    from django.tasks import TaskContext, task
else:  # Django 5.2: the backport
    from django_tasks import TaskContext, task

_WORD = re.compile(r"[\w']+")


@task
def count_words(text: str) -> dict[str, Any]:
    """Count the words of `text`, and name its three most common ones."""
    words = _WORD.findall(text.lower())
    return {
        "words": len(words),
        "distinct": len(set(words)),
        "most_common": [[word, count] for word, count in Counter(words).most_common(3)],
    }


@task(takes_context=True)
def succeed_on_retry(context: TaskContext[Any, Any], failures: int = 1) -> dict[str, Any]:
    """Fail the first `failures` attempts on purpose, then succeed: tasks are retried too."""
    if context.attempt <= failures:
        raise RuntimeError(
            f"Attempt {context.attempt} fails on purpose; attempt {failures + 1} will succeed."
        )
    return {"succeeded_on_attempt": context.attempt}
