"""End to end on the real database: work goes in as a user's code puts it in, and a real
`manage.py todo_worker` process of the example project runs it."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest
from django.test import Client

from example_project import tasks
from switchboard_todos.compat import TaskResultStatus
from switchboard_todos.models import Event, State, Todo
from tests.example.deliveries import PUSH, deliver

pytestmark = pytest.mark.django_db(transaction=True)

Worker = Callable[..., "subprocess.Popen[str]"]


@pytest.fixture
def example_worker(
    spawn: Callable[..., subprocess.Popen[str]], subprocess_env: dict[str, str]
) -> Worker:
    """Start `manage.py todo_worker` with the example project's settings, retrying at once."""
    subprocess_env.pop("SECRET_KEY", None)
    subprocess_env.update(
        DJANGO_SETTINGS_MODULE="example_project.settings",
        DEBUG="1",
        SWITCHBOARD_TODOS_BACKOFF_BASE="0.05",
    )

    def start(*args: str) -> subprocess.Popen[str]:
        return spawn("manage", "todo_worker", *args)

    return start


def run_to_the_end(worker: subprocess.Popen[str]) -> None:
    _, err = worker.communicate(timeout=90)
    assert worker.returncode == 0, err


def test_a_signed_webhook_ends_done_with_its_handlers_result(example_worker: Worker) -> None:
    """Delivery (twice) → one event and todo → the worker process runs summarise_push."""
    client = Client()
    first = deliver(client, delivery="e2e-push-1")
    assert first.status_code == 202
    repeat = deliver(client, delivery="e2e-push-1")
    assert (repeat.status_code, repeat.json()["todo_id"]) == (200, first.json()["todo_id"])

    run_to_the_end(example_worker("--max-todos", "1"))

    todo = Todo.objects.get()
    assert todo.id == first.json()["todo_id"]
    assert (todo.state, todo.kind, todo.attempt) == (State.DONE, "github.push", 1)
    assert todo.result == {
        "repository": "octo/hello",
        "ref": PUSH["ref"],
        "pusher": "octocat",
        "commits": 1,
        "authors": ["Octo Cat"],
        "messages": ["Fix the thing"],
    }
    assert Event.objects.get().delivery_id == "e2e-push-1"


def test_django_tasks_end_successful_with_their_return_values(example_worker: Worker) -> None:
    """enqueue() → the worker process runs the tasks, a failed attempt retried → SUCCESSFUL."""
    words = tasks.count_words.enqueue("The cat and the hat")
    retried = tasks.succeed_on_retry.enqueue(failures=1)
    assert (words.status, retried.status) == (TaskResultStatus.READY, TaskResultStatus.READY)

    run_to_the_end(example_worker("--max-todos", "3"))  # one attempt, then two

    counted = tasks.count_words.get_result(words.id)
    assert counted.status == TaskResultStatus.SUCCESSFUL
    assert counted.return_value == {
        "words": 5,
        "distinct": 4,
        "most_common": [["the", 2], ["cat", 1], ["and", 1]],
    }
    succeeded = tasks.succeed_on_retry.get_result(retried.id)
    assert succeeded.status == TaskResultStatus.SUCCESSFUL
    assert succeeded.return_value == {"succeeded_on_attempt": 2}
    assert [error.exception_class_path for error in succeeded.errors] == ["builtins.RuntimeError"]
    assert len(succeeded.worker_ids) == 2
