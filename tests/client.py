"""A stand-alone queue client for tests that need real separate processes.

python -m tests.client drain --queue q --owner w1 [--batch 50]
    claim and complete until the queue is empty; print {"owner", "completed": [ids]}
python -m tests.client hold --queue q --owner w1 --ttl 1
    claim one todo, print its id, then hang holding the lease (until killed)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import django


def drain(queue: str, owner: str, batch: int) -> None:
    from switchboard_todos.models import Todo

    completed: list[str] = []
    started = time.perf_counter()
    while True:
        if batch == 1:
            todo = Todo.objects.claim_next(queue, owner, 60)
            if todo is None:
                break
            Todo.objects.complete(todo.id, owner, {"by": owner})
            completed.append(todo.id)
        else:
            todos = Todo.objects.claim_batch(queue, owner, 60, limit=batch)
            if not todos:
                break
            completed += Todo.objects.complete_many(owner, {t.id: {"by": owner} for t in todos})
    elapsed = time.perf_counter() - started
    print(json.dumps({"owner": owner, "completed": completed, "seconds": elapsed}))


def hold(queue: str, owner: str, ttl: float) -> None:
    from switchboard_todos.models import Todo

    todo = Todo.objects.claim_next(queue, owner, ttl)
    print(todo.id if todo else "", flush=True)
    while True:
        time.sleep(60)


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["drain", "hold"])
    parser.add_argument("--queue", required=True)
    parser.add_argument("--owner", required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--ttl", type=float, default=60)
    options = parser.parse_args()
    django.setup()
    if options.action == "drain":
        drain(options.queue, options.owner, options.batch)
    else:
        hold(options.queue, options.owner, options.ttl)
    sys.exit(0)


if __name__ == "__main__":
    main()
