"""The API's threads take turns between agents (agents/fair_threads.py), with real threads."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from functools import partial
from typing import Any

import pytest

from switchboard_todos.agents.fair_threads import FairThreads, tenant


def submitted_as(threads: FairThreads, who: str, fn: Callable[[], Any]) -> Future[Any]:
    """`fn` submitted from a request of `who`, as api/asgi.py submits a verb."""
    context = contextvars.copy_context()
    context.run(tenant.set, who)
    return context.run(threads.submit, fn)


def held(threads: FairThreads) -> tuple[threading.Event, Future[Any]]:
    """The one thread of `threads` busy until the event is set."""
    started, go = threading.Event(), threading.Event()

    def wait() -> None:
        started.set()
        go.wait(10)

    busy = submitted_as(threads, "busy", wait)
    assert started.wait(10)
    return go, busy


def run_in_order(submissions: list[tuple[str, str]]) -> list[str]:
    """Submit `(agent, label)` pairs, in order, to one thread held busy meanwhile; the labels in
    the order their work ran."""
    threads = FairThreads(1, thread_name_prefix="test-fair")
    try:
        go, busy = held(threads)
        ran: list[str] = []
        futures = [
            submitted_as(threads, who, partial(ran.append, label)) for who, label in submissions
        ]
        go.set()
        for future in [busy, *futures]:
            future.result(10)
        # A tenant's lane is gone once it is empty: the lanes are bounded by the requests in
        # flight (request_cap.py), whatever tokens a hostile client makes up.
        assert len(threads._waiting) == 0
        return ran
    finally:
        threads.shutdown()


def test_another_agents_work_is_next_not_behind_a_flood() -> None:
    flood = [("flood", f"flood {n}") for n in range(6)]
    ran = run_in_order([*flood[:5], ("calm", "calm"), flood[5]])
    # A first-come queue would run the calm agent's work sixth; here it is second, and each
    # agent's own work keeps its order.
    assert ran == ["flood 0", "calm", *(f"flood {n}" for n in range(1, 6))]


def test_agents_take_turns_one_work_each() -> None:
    ran = run_in_order([(who, f"{who}{n}") for who in "abc" for n in range(2)])
    assert ran == ["a0", "b0", "c0", "a1", "b1", "c1"]


def test_results_errors_and_every_thread_at_once() -> None:
    threads = FairThreads(3, thread_name_prefix="test-fair")
    try:
        assert submitted_as(threads, "a", lambda: 42).result(10) == 42
        with pytest.raises(ZeroDivisionError):
            submitted_as(threads, "a", lambda: 1 / 0).result(10)
        # Three pieces of work of one agent that wait for each other run on three threads.
        barrier = threading.Barrier(3)
        names = [
            submitted_as(
                threads, "a", lambda: (barrier.wait(10), threading.current_thread().name)[1]
            )
            for _ in range(3)
        ]
        assert sorted(future.result(10) for future in names) == [f"test-fair_{n}" for n in range(3)]
    finally:
        threads.shutdown()


def test_shutdown_finishes_what_waits_or_cancels_it() -> None:
    threads = FairThreads(1, thread_name_prefix="test-fair")
    go, _ = held(threads)
    waiting = submitted_as(threads, "a", lambda: "done")
    go.set()
    threads.shutdown(wait=True)
    assert waiting.result(0) == "done"
    with pytest.raises(RuntimeError, match="after shutdown"):
        threads.submit(lambda: None)

    threads = FairThreads(1, thread_name_prefix="test-fair")
    go, _ = held(threads)
    dropped = submitted_as(threads, "a", lambda: "never")
    threads.shutdown(wait=False, cancel_futures=True)
    go.set()
    with pytest.raises(CancelledError):
        dropped.result(10)


def test_at_least_one_thread() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        FairThreads(0, thread_name_prefix="test-fair")


def test_a_thread_idle_for_its_linger_calls_when_idle_once() -> None:
    """The API gives a thread's kept connection back to the pool there (api/asgi.py)."""
    idle: list[str] = []
    went_idle = threading.Event()

    def when_idle() -> None:
        idle.append(threading.current_thread().name)
        went_idle.set()

    threads = FairThreads(1, thread_name_prefix="test-fair", when_idle=when_idle, linger=0.01)
    try:
        assert submitted_as(threads, "a", lambda: 1).result(10) == 1
        assert went_idle.wait(10)
        went_idle.clear()
        # Once per stretch of work: a thread already idle waits for work, not for its linger.
        assert not went_idle.wait(0.2)
        assert submitted_as(threads, "a", lambda: 2).result(10) == 2
        assert went_idle.wait(10)
        assert idle == ["test-fair_0", "test-fair_0"]
    finally:
        threads.shutdown()


def test_work_that_keeps_coming_within_the_linger_keeps_the_thread_busy() -> None:
    idle: list[int] = []
    # A linger far longer than this test: each work here comes well within it.
    threads = FairThreads(
        1, thread_name_prefix="test-fair", when_idle=lambda: idle.append(1), linger=60
    )
    try:
        for n in range(20):
            assert submitted_as(threads, "a", partial(int, n)).result(10) == n
        assert idle == []
    finally:
        threads.shutdown()
    # Shut down, the thread ends without calling it: whoever shuts down closes what it keeps.
    assert idle == []


def test_after_each_runs_on_the_thread_after_each_work() -> None:
    """The surfaces' threads tidy their connections there (thread_connections.py)."""
    ran: list[str] = []
    threads = FairThreads(
        1,
        thread_name_prefix="test-fair",
        after_each=lambda: ran.append(f"after, on {threading.current_thread().name}"),
    )
    try:
        for n in range(2):
            assert submitted_as(threads, "a", partial(ran.append, f"work {n}")).result(10) is None
        threads.shutdown(wait=True)
        assert ran == ["work 0", "after, on test-fair_0", "work 1", "after, on test-fair_0"]
    finally:
        threads.shutdown()


def test_a_failing_when_idle_is_logged_and_the_thread_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failed = threading.Event()

    def when_idle() -> None:
        failed.set()
        raise RuntimeError("the pool is gone")

    threads = FairThreads(1, thread_name_prefix="test-fair", when_idle=when_idle, linger=0.01)
    try:
        submitted_as(threads, "a", lambda: None).result(10)
        assert failed.wait(10)
        assert submitted_as(threads, "a", lambda: "still serving").result(10) == "still serving"
    finally:
        threads.shutdown()
    assert "when_idle failed" in caplog.text and "the pool is gone" in caplog.text
