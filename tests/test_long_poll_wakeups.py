"""Many long polls of a queue, one new todo: about one claim, not one per waiting poll."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections

from switchboard_todos.claims import listen, long_polls
from switchboard_todos.managers import TodoManager
from switchboard_todos.models import Todo
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

#: Long polls waiting at once, and how long each waits.
WAITS = 20
WAIT = 10.0


@pytest.fixture(autouse=True)
def _stop_waiting() -> Iterator[None]:
    yield
    long_polls.stop()


class Claims:
    """Counts the claim statements of every long poll in this process."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self._lock = threading.Lock()
        claim = TodoManager._claim

        def counted(manager: TodoManager, params: Any) -> Any:
            with self._lock:
                self.count += 1
            return claim(manager, params)

        monkeypatch.setattr(TodoManager, "_claim", counted)

    def settled(self) -> int:
        """The count, once no claim has run for half a second (the waits are all waiting)."""
        seen = [-1, time.monotonic()]

        def still() -> bool:
            if self.count != seen[0]:
                seen[:] = [self.count, time.monotonic()]
            return time.monotonic() - seen[1] >= 0.5

        wait_until(still, "the long polls to settle")
        return self.count


def sync_waits(claimed: list[Todo | None]) -> list[threading.Thread]:
    """WAITS threads, each in `claim_next(wait=WAIT)`."""

    def poll() -> None:
        try:
            claimed.append(Todo.objects.claim_next("q", "o", 30, wait=WAIT))
        finally:
            connections.close_all()

    return [threading.Thread(target=poll) for _ in range(WAITS)]


def async_waits(claimed: list[Todo | None]) -> list[threading.Thread]:
    """One thread whose event loop runs WAITS coroutines, each in `aclaim_next(wait=WAIT)`."""

    async def poll() -> None:
        claimed.append(await Todo.objects.aclaim_next("q", "o", 30, wait=WAIT))

    async def main() -> None:
        await asyncio.gather(*(poll() for _ in range(WAITS)))

    return [threading.Thread(target=asyncio.run, args=(main(),))]


@pytest.mark.parametrize("waits", [sync_waits, async_waits], ids=["sync", "async"])
def test_a_new_todo_costs_about_one_claim(
    monkeypatch: pytest.MonkeyPatch, waits: Callable[[list[Todo | None]], list[threading.Thread]]
) -> None:
    """Twenty long polls wait in a queue; one todo wakes about one of them, and a batch of
    nineteen more, one notification, reaches all the others: each waiter whose claim came back
    full wakes the next."""
    monkeypatch.setattr(listen, "POLL_MAX", 60.0)  # no polling: only notifications wake them
    claims = Claims(monkeypatch)
    claimed: list[Todo | None] = []
    threads = waits(claimed)
    for thread in threads:
        thread.start()
    before = claims.settled()
    Todo.objects.create_todo(queue="q", kind="k")
    wait_until(lambda: len(claimed) == 1, "the todo to be claimed")
    assert claims.settled() - before <= 3
    before = claims.count
    Todo.objects.create_many({"queue": "q", "kind": "k"} for _ in range(WAITS - 1))
    for thread in threads:
        thread.join(WAIT + 30)
    assert len(claimed) == WAITS and all(todo is not None for todo in claimed)
    assert claims.count - before <= WAITS + 2
