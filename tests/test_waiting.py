"""The hand-out of wake-ups among long polls, and the claim threads (waiting.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from django.db import connection

from switchboard_todos.claims import long_polls
from switchboard_todos.claims.long_polls import ClaimThreads, Waiter, Waiters
from tests.helpers import wait_until


class Hub:
    """Waiters without a listener, and a log of who was woken."""

    def __init__(self) -> None:
        self.waiters = Waiters(None)
        self.woken: list[str] = []

    def wait(self, name: str, owner: str, queues: tuple[str, ...] = ("q",)) -> Waiter:
        """A waiter named `name` that joins and waits."""
        waiter = Waiter(owner, queues)
        self.waiters.join(waiter)
        assert self.waiters.idle(waiter, lambda: self.woken.append(name))
        return waiter


@pytest.fixture
def hub() -> Hub:
    return Hub()


def test_a_notification_wakes_one_waiter_of_its_queue(hub: Hub) -> None:
    hub.wait("a1", "a")
    hub.wait("a2", "a")
    hub.wait("other", "a", ("elsewhere",))
    hub.waiters.notify("q")
    assert hub.woken == ["a1"]
    hub.waiters.notify("nobody's")
    assert hub.woken == ["a1"]


def test_the_owners_take_turns(hub: Hub) -> None:
    """The owner rung least recently goes first; within an owner, the longest waiting."""
    hub.wait("a1", "a")
    hub.wait("a2", "a")
    hub.wait("b1", "b")
    for _ in range(3):
        hub.waiters.notify("q")
    assert hub.woken == ["a1", "b1", "a2"]


def test_a_full_claim_wakes_the_next_and_a_short_one_after_it_stops(hub: Hub) -> None:
    first = hub.wait("a1", "a")
    second = hub.wait("a2", "a")
    hub.wait("a3", "a")
    hub.waiters.notify("q")
    assert hub.waiters.woken(first)
    hub.waiters.claimed(first, ["q"], limit=1)  # full: there may be more
    assert hub.woken == ["a1", "a2"]
    assert hub.waiters.woken(second)
    hub.waiters.claimed(second, [], limit=1)
    assert hub.woken == ["a1", "a2"]


def test_an_empty_claim_passes_a_notification_on_to_another_owner(hub: Hub) -> None:
    """The todo may be one only another owner may claim (assigned to it): that owner tries,
    each owner once."""
    first = hub.wait("a1", "a")
    hub.wait("a2", "a")
    other = hub.wait("b1", "b")
    hub.waiters.notify("q")
    hub.waiters.claimed(first, [], limit=1)
    assert hub.woken == ["a1", "b1"]
    hub.waiters.claimed(other, [], limit=1)
    assert hub.woken == ["a1", "b1"]


def test_a_notification_while_every_waiter_claims_is_kept(hub: Hub) -> None:
    """Its todo may have come after their claims began: the next to wait claims again."""
    waiter = Waiter("a", ["q"])
    hub.waiters.join(waiter)
    hub.waiters.notify("q")
    assert not hub.waiters.idle(waiter, lambda: None)  # claim again at once
    assert hub.waiters.idle(waiter, lambda: None)  # taken: the next wait waits


def test_a_waiter_that_leaves_rung_hands_the_ring_on(hub: Hub) -> None:
    first = hub.wait("a1", "a")
    hub.wait("a2", "a")
    hub.waiters.notify("q")
    hub.waiters.leave(first)
    assert hub.woken == ["a1", "a2"]


def test_of_the_waiters_of_one_owner_and_queues_one_polls(hub: Hub) -> None:
    """Their claims would find the same: a waiter whose wait ended skips its poll when another
    of them claimed meanwhile."""
    first = hub.wait("a1", "a")
    second = hub.wait("a2", "a")
    other = hub.wait("b1", "b")
    assert hub.waiters.woken(first)
    hub.waiters.claimed(first, [], limit=1)
    assert not hub.waiters.woken(second)
    assert hub.waiters.woken(other)


def test_a_reconnect_wakes_every_waiter(hub: Hub) -> None:
    hub.wait("a1", "a")
    hub.wait("b1", "b", ("elsewhere",))
    hub.waiters.ring_all()
    assert sorted(hub.woken) == ["a1", "b1"]


def test_a_ring_for_a_closed_event_loop_is_dropped(hub: Hub) -> None:
    """A waiter whose loop has gone never stops the listener's thread."""
    waiter = Waiter("a", ["q"])
    hub.waiters.join(waiter)

    def closed() -> None:
        raise RuntimeError("Event loop is closed")

    hub.waiters.idle(waiter, closed)
    hub.waiters.notify("q")
    assert waiter.ring is None


@pytest.fixture
def threads() -> Iterator[ClaimThreads]:
    claims = ClaimThreads(1, linger=5)
    yield claims
    claims.stop()


def test_the_owners_take_turns_on_the_claim_threads(threads: ClaimThreads) -> None:
    """One owner's many claims do not hold another's back: after one of them, it goes."""
    ran: list[str] = []
    gate = threading.Event()

    async def main() -> None:
        blocked = asyncio.ensure_future(threads.run("flood", gate.wait, 30))
        await asyncio.sleep(0.1)  # the one thread is busy: the rest queue
        queued = [threads.run("flood", ran.append, "flood") for _ in range(5)]
        queued.append(threads.run("calm", ran.append, "calm"))
        tasks = [asyncio.ensure_future(claim) for claim in queued]
        await asyncio.sleep(0.1)
        gate.set()
        await asyncio.gather(blocked, *tasks)

    asyncio.run(main())
    assert ran == ["flood", "calm", "flood", "flood", "flood", "flood"]


def test_an_error_reaches_the_caller(threads: ClaimThreads) -> None:
    def fails() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        asyncio.run(threads.run("a", fails))


def test_a_claim_thread_gives_its_pooled_connection_back_once_idle(
    threads: ClaimThreads, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept from one claim to the next (closed only if a database error left it unusable, or
    given back if another thread waits for the pool), and given back once the thread has had
    no claim for KEEP_WHILE_IDLE seconds: once, and the thread goes on (thread_connections.py)."""
    calls: list[str] = []
    gave_back = threading.Event()

    def give_back() -> None:
        calls.append("give back")
        gave_back.set()

    monkeypatch.setattr(long_polls, "keep_connections", lambda: calls.append("keep"))
    monkeypatch.setattr(long_polls, "finish_with_connections", give_back)
    for number in range(2):
        assert asyncio.run(threads.run("a", lambda: "claimed")) == "claimed"
        assert gave_back.wait(10)
        gave_back.clear()
        assert not gave_back.wait(0.3)  # an idle thread gives it back once, not at every wait
        assert calls == ["keep", "give back"] * (number + 1)


@pytest.mark.django_db(transaction=True)
def test_a_claim_thread_keeps_its_connection_until_it_stops(threads: ClaimThreads) -> None:
    def backend() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid: int = cursor.fetchone()[0]
        return pid

    def alive(pid: int) -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
            return bool(cursor.fetchone()[0])

    pid = asyncio.run(threads.run("a", backend))
    assert asyncio.run(threads.run("a", backend)) == pid and alive(pid)
    threads.stop()
    wait_until(lambda: not alive(pid), "the claim thread's connection to close")
