"""The example's handlers: what the worker runs for each kind of todo.

Webhook todos get the kind `<source>.<event>` (see `webhooks.Delivery.todo_kind`). Each handler
returns the result stored on the todo, visible in the admin; raising fails the attempt, which
is retried with backoff and dead-lettered at `max_attempts`. Todos arrive at least once, so
these only read their input and return a result: running one twice does no harm.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from switchboard_todos.handlers import handler
from switchboard_todos.models import State, Todo

logger = logging.getLogger(__name__)

#: Attempts the flaky handler fails before it succeeds, unless the payload says `failures`.
FLAKY_FAILURES = 2
#: The longest the slow handler sleeps, whatever its payload asks.
SLOW_MAX_SECONDS = 60.0


class DeliberateFailure(RuntimeError):
    """Raised on purpose, to show retries and dead letters."""


def _repository(payload: dict[str, Any]) -> str:
    repository = payload.get("repository") or {}
    return str(repository.get("full_name") or repository.get("name") or "")


@handler("github.push")
def summarise_push(todo: Todo) -> dict[str, Any]:
    """Summarise a GitHub push: where, who, and the first line of each commit message."""
    payload = todo.payload
    commits = payload.get("commits") or []
    summary = {
        "repository": _repository(payload),
        "ref": payload.get("ref", ""),
        "pusher": (payload.get("pusher") or {}).get("name", ""),
        "commits": len(commits),
        "authors": sorted({(c.get("author") or {}).get("name", "") for c in commits} - {""}),
        "messages": [str(c.get("message", "")).split("\n", 1)[0] for c in commits],
    }
    logger.info(
        "Push to %s %s by %s: %d commit(s)",
        summary["repository"],
        summary["ref"],
        summary["pusher"],
        summary["commits"],
    )
    return summary


@handler("github.pull_request")
def summarise_pull_request(todo: Todo) -> dict[str, Any]:
    """Summarise a GitHub pull request event: what happened to which pull request."""
    payload = todo.payload
    pull_request = payload.get("pull_request") or {}
    summary = {
        "repository": _repository(payload),
        "action": payload.get("action", ""),
        "number": pull_request.get("number", payload.get("number")),
        "title": pull_request.get("title", ""),
        "author": (pull_request.get("user") or {}).get("login", ""),
    }
    logger.info(
        "Pull request %s #%s %s: %s",
        summary["repository"],
        summary["number"],
        summary["action"],
        summary["title"],
    )
    return summary


@handler("github.ping")
def acknowledge_ping(todo: Todo) -> dict[str, Any]:
    """GitHub's first delivery to a new webhook; nothing to do but say it arrived."""
    return {"zen": todo.payload.get("zen", ""), "hook_id": todo.payload.get("hook_id")}


@handler("example.flaky")
def flaky(todo: Todo) -> dict[str, Any]:
    """Fail the first attempts, then succeed: decided by the attempt number, not by chance."""
    failures = int(todo.payload.get("failures", FLAKY_FAILURES))
    if todo.attempt <= failures:
        raise DeliberateFailure(
            f"Attempt {todo.attempt} fails on purpose; attempt {failures + 1} will succeed."
        )
    return {"succeeded_on_attempt": todo.attempt}


@handler("example.doomed")
def doomed(todo: Todo) -> None:
    """Always fail, so that the todo ends as a dead letter after `max_attempts` attempts."""
    raise DeliberateFailure(
        f"Attempt {todo.attempt} of {todo.max_attempts} fails, as every attempt here does."
    )


@handler("example.slow")
def slow(todo: Todo) -> dict[str, Any]:
    """Sleep the payload's `seconds` (a minute at most): time for demo_crash to kill a worker."""
    seconds = min(float(todo.payload.get("seconds", 1.0)), SLOW_MAX_SECONDS)
    time.sleep(seconds)
    return {"slept": seconds, "attempt": todo.attempt}


@handler("example.minutely")
def count_by_state(todo: Todo) -> dict[str, int]:
    """A periodic todo (settings.SWITCHBOARD_TODOS_SCHEDULES): how many todos are in each state."""
    return {state: Todo.objects.filter(state=state).count() for state in State.values}
