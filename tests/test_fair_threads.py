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
