"""The example's handlers, each run on a todo claimed through the real API."""

from __future__ import annotations

import time

import pytest

from example_project import todo_handlers
from example_project.todo_handlers import DeliberateFailure
from switchboard_todos.handlers import autodiscover, get_handler
from switchboard_todos.models import State, Todo
from tests.helpers import MakeTodo


def claimed(make_todo: MakeTodo, kind: str, **fields: object) -> Todo:
    todo = make_todo(kind=kind, **fields)
    return Todo.objects.claim(todo.id, "w1", 30)


def test_autodiscovery_finds_the_example_handlers() -> None:
    """example_project is an installed app, so the worker's autodiscover() registers these."""
    autodiscover()
    assert get_handler("github.push") is todo_handlers.summarise_push
    assert get_handler("github.pull_request") is todo_handlers.summarise_pull_request
    assert get_handler("github.ping") is todo_handlers.acknowledge_ping
    assert get_handler("example.flaky") is todo_handlers.flaky
    assert get_handler("example.doomed") is todo_handlers.doomed
    assert get_handler("example.slow") is todo_handlers.slow


def test_push_summary(make_todo: MakeTodo) -> None:
    """Repository, ref, pusher, commit count, authors and first lines of the messages."""
    payload = {
        "ref": "refs/heads/main",
        "repository": {"full_name": "octo/hello"},
        "pusher": {"name": "octocat"},
        "commits": [
            {"message": "Fix the thing\n\nLong story.", "author": {"name": "Octo Cat"}},
            {"message": "Add a test", "author": {"name": "Mona"}},
            {"message": "Tidy", "author": {"name": "Octo Cat"}},
        ],
    }
    todo = claimed(make_todo, "github.push", payload=payload)
    result = todo_handlers.summarise_push(todo)
    assert result == {
        "repository": "octo/hello",
        "ref": "refs/heads/main",
        "pusher": "octocat",
        "commits": 3,
        "authors": ["Mona", "Octo Cat"],
        "messages": ["Fix the thing", "Add a test", "Tidy"],
    }
    assert Todo.objects.complete(todo.id, "w1", result).result == result


def test_push_summary_of_a_sparse_payload(make_todo: MakeTodo) -> None:
    """A push without commits or pusher (a tag deletion, say) still summarises."""
    todo = claimed(make_todo, "github.push", payload={"ref": "refs/tags/v1"})
    assert todo_handlers.summarise_push(todo) == {
        "repository": "",
        "ref": "refs/tags/v1",
        "pusher": "",
        "commits": 0,
        "authors": [],
        "messages": [],
    }


def test_pull_request_summary(make_todo: MakeTodo) -> None:
    """Action, number, title and author of the pull request."""
    payload = {
        "action": "opened",
        "repository": {"name": "hello"},
        "pull_request": {"number": 7, "title": "Add webhooks", "user": {"login": "mona"}},
    }
    todo = claimed(make_todo, "github.pull_request", payload=payload)
    assert todo_handlers.summarise_pull_request(todo) == {
        "repository": "hello",
        "action": "opened",
        "number": 7,
        "title": "Add webhooks",
        "author": "mona",
    }


def test_ping_acknowledged(make_todo: MakeTodo) -> None:
    """GitHub's ping returns its zen line and hook id."""
    todo = claimed(make_todo, "github.ping", payload={"zen": "Keep it simple.", "hook_id": 9})
    assert todo_handlers.acknowledge_ping(todo) == {"zen": "Keep it simple.", "hook_id": 9}


def test_flaky_fails_twice_then_succeeds(make_todo: MakeTodo) -> None:
    """Attempts 1 and 2 raise; each failure retries; attempt 3 returns a result."""
    todo = claimed(make_todo, "example.flaky")
    for attempt in (1, 2):
        assert todo.attempt == attempt
        with pytest.raises(DeliberateFailure, match=f"Attempt {attempt} fails on purpose"):
            todo_handlers.flaky(todo)
        assert Todo.objects.fail(todo.id, "w1", f"attempt {attempt}", retry_in=0).state == (
            State.PENDING
        )
        todo = Todo.objects.claim(todo.id, "w1", 30)
    assert todo_handlers.flaky(todo) == {"succeeded_on_attempt": 3}


def test_flaky_failures_can_be_set_in_the_payload(make_todo: MakeTodo) -> None:
    """`failures: 0` succeeds at once."""
    todo = claimed(make_todo, "example.flaky", payload={"failures": 0})
    assert todo_handlers.flaky(todo) == {"succeeded_on_attempt": 1}


def test_doomed_dead_letters_at_max_attempts(make_todo: MakeTodo) -> None:
    """Every attempt raises, so the last failure leaves the todo failed (a dead letter)."""
    todo = claimed(make_todo, "example.doomed", max_attempts=2)
    with pytest.raises(DeliberateFailure, match="Attempt 1 of 2 fails") as first:
        todo_handlers.doomed(todo)
    assert Todo.objects.fail(todo.id, "w1", first.value, retry_in=0).state == State.PENDING
    todo = Todo.objects.claim(todo.id, "w1", 30)
    with pytest.raises(DeliberateFailure, match="Attempt 2 of 2 fails") as last:
        todo_handlers.doomed(todo)
    dead = Todo.objects.fail(todo.id, "w1", last.value)
    assert dead.state == State.FAILED
    assert dead.result is not None
    assert dead.result["message"] == "Attempt 2 of 2 fails, as every attempt here does."


def test_slow_sleeps_as_long_as_the_payload_says_up_to_a_minute(
    make_todo: MakeTodo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`seconds` from the payload (1 by default), capped at SLOW_MAX_SECONDS."""
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    for seconds, expected in [(None, 1.0), (0.25, 0.25), (3600, todo_handlers.SLOW_MAX_SECONDS)]:
        payload = {} if seconds is None else {"seconds": seconds}
        todo = claimed(make_todo, "example.slow", payload=payload)
        assert todo_handlers.slow(todo) == {"slept": expected, "attempt": 1}
    assert slept == [1.0, 0.25, 60.0]
