"""A claiming process for the queue limit tests: claim, hold the todos a moment, complete them,
until the queue has nothing pending or claimed left.

    python -m tests.claimer QUEUE OWNER --hold SECONDS --limit N
"""

from __future__ import annotations

import argparse
import time

import django


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("queue")
    parser.add_argument("owner")
    parser.add_argument("--hold", type=float, default=0.0)
    parser.add_argument("--limit", type=int, default=1)
    arguments = parser.parse_args()
    django.setup()
    from switchboard_todos.models import State, Todo

    live = Todo.objects.filter(queue=arguments.queue, state__in=[State.PENDING, State.CLAIMED])
    while True:
        todos = Todo.objects.claim_batch(arguments.queue, arguments.owner, 60, arguments.limit)
        if not todos:
            if not live.exists():
                return
            time.sleep(0.005)
            continue
        time.sleep(arguments.hold)
        Todo.objects.complete_many(arguments.owner, {todo.id: None for todo in todos})


if __name__ == "__main__":
    main()
