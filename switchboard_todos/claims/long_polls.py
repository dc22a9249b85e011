"""Long polls that hold nothing while they wait: the hand-out of wake-ups, and the claim threads.

A long poll (`claim_batch(..., wait=)`, its async twin, and through them every remote surface's
long poll) joins its database's `Waiters` for as long as it lasts. While it waits it
holds no connection and, when async, no thread. The process's one LISTEN connection
(claims/listen.py) hands each notification to one waiter, not to all: a notification says only that
a queue has new work, and the todos one statement makes claimable in a queue send one
notification between them, so the wake-ups go out one at a time:

* a notification for a queue rings one idle waiter of that queue, the owners (agents) taking
  turns;
* a waiter whose claim came back full rings the next: there may be more;
* a waiter rung by a notification whose claim came back short passes the ring on to a waiter
  of an owner that has not tried it: the todo may be one only that owner may claim (assigned
  to it), or taken already by a claim that was not waiting;
* a notification that finds no idle waiter, while some are claiming, is kept for the first of
  them to wait again: its todo may have been committed after their claim began.

So N idle long polls of a queue cost about one claim per new todo (and one more per owner
waiting there when nobody claims it), not N. Waiters also poll, as a retry coming due or a
expired lease sends no notification: at most once per `listen.POLL_MAX` while listening, and of
the waiters of one owner and one set of queues only one polls, since their claims would all
find the same.

The claims of an async long poll run on the process's `ClaimThreads`: a few threads, each
keeping its database connection from one claim to the next (a pooled one goes back to the pool
once its thread is idle, thread_connections.py), taking the owners in turn, so that no owner's
claims queue behind another owner's many. A blocking (sync) long poll claims on its own thread
and keeps that thread's connection while it waits: reconnecting after every wait would cost more
than holding the connection, and the thread, the caller's, holds it anyway between its own
statements.

An async long poll may be cancelled: its client went away (agents/disconnects.py). Cancelled
while it waits, it leaves the waiters and claims nothing. Cancelled while a claim of its runs on
a thread (the race), it cannot stop that claim: `cancellable_claim` lets the claim finish and
gives back what it took, released at once with its attempts not counted, rather than leave it
claimed for nobody until its lease expires.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from django.db import connections

from switchboard_todos.claims import listen
from switchboard_todos.lanes import Lanes
from switchboard_todos.thread_connections import (
    KEEP_WHILE_IDLE,
    Idle,
    finish_with_connections,
    keep_connections,
)

logger = logging.getLogger("switchboard_todos.long_polls")

P = ParamSpec("P")
R = TypeVar("R")

#: Threads that run the claims of async long polls, per process.
CLAIM_THREADS = 4
#: How long an idle claim thread keeps its connection before it ends (as the shared listener).
CLAIM_THREAD_LINGER = listen.SHARED_LINGER

Group = tuple[str, frozenset[str]]


@dataclass(frozen=True)
class Ring:
    """A wake-up handed to one waiter: new work in `queue` (None: anything, after the LISTEN
    connection came back); `fresh` when a notification sent it, so that a waiter whose claim
    comes back short passes it on to an owner not in `tried`."""

    queue: str | None
    fresh: bool
    tried: frozenset[str] = frozenset()


class Waiter:
    """One long poll of `owner` in `queues`, while it lasts."""

    def __init__(self, owner: str, queues: Iterable[str]) -> None:
        self.owner = owner
        self.queues = frozenset(queues)
        self.group: Group = (owner, self.queues)
        #: The ring it was woken by and has not yet claimed for.
        self.ring: Ring | None = None
        #: Since when it waits; None while it claims.
        self.idle_since: float | None = None
        self.wake: Callable[[], object] = _nothing


class Waiters:
    """The long polls of one database in this process, and who of them to wake.

    Subscribed to `listener` (None: LISTEN is off) while at least one waiter has joined.
    """

    def __init__(self, listener: listen.Listener | None) -> None:
        self.listener = listener
        self._lock = threading.Lock()
        #: The waiters waiting now, in the order they began to: all, and by queue.
        self._idle: dict[Waiter, None] = {}
        self._idle_in: dict[str, dict[Waiter, None]] = {}
        #: How many joined waiters want each queue, idle or claiming.
        self._wanted: Counter[str] = Counter()
        #: Rings of notifications that came while every waiter of their queue was claiming.
        self._kept: dict[str, Ring] = {}
        #: When each owner was last rung (a count of rings): the least recent goes first.
        self._turns: dict[str, int] = {}
        self._rings = itertools.count(1)
        self._owners: Counter[str] = Counter()
        self._groups: Counter[Group] = Counter()
        #: When a waiter of each group last claimed.
        self._claimed_at: dict[Group, float] = {}

    # What the listener tells

    def notify(self, queue: str) -> None:
        """New work in `queue`: ring one waiter of it."""
        with self._lock:
            self._hand_out(Ring(queue, fresh=True))

    def ring_all(self) -> None:
        """The LISTEN connection came back: every idle waiter claims again."""
        with self._lock:
            for waiter in list(self._idle):
                self._ring(waiter, Ring(None, fresh=False))

    # A long poll's steps

    def join(self, waiter: Waiter) -> bool:
        """Take part until `leave`; whether notifications are heard now (see `listening_within`)."""
        with self._lock:
            self._wanted.update(waiter.queues)
            self._groups[waiter.group] += 1
            if not self._owners[waiter.owner]:
                self._turns[waiter.owner] = next(self._rings)  # a newcomer queues behind
            self._owners[waiter.owner] += 1
            if self.listener is None:
                return True
            return self.listener.subscribe(self, timeout=0)

    def listening_within(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the listener to hear notifications."""
        return self.listener is None or self.listener.listening_within(timeout)

    def idle(self, waiter: Waiter, wake: Callable[[], object]) -> bool:
        """Begin to wait, to be woken by `wake`; False when a kept ring is taken instead (the
        waiter claims again at once)."""
        with self._lock:
            for queue in waiter.queues:
                kept = self._kept.get(queue)
                if kept is not None and waiter.owner not in kept.tried:
                    del self._kept[queue]
                    waiter.ring = kept
                    return False
            waiter.wake = wake
            waiter.idle_since = time.monotonic()
            self._idle[waiter] = None
            for queue in waiter.queues:
                self._idle_in.setdefault(queue, {})[waiter] = None
            return True

    def woken(self, waiter: Waiter) -> bool:
        """After a wait: whether to claim now. True when rung, or when it is the waiter's turn
        to poll: no waiter of its group claimed since it began to wait."""
        with self._lock:
            since = waiter.idle_since
            if since is None:  # rung
                return True
            self._stop_waiting(waiter)
            return self._claimed_at.get(waiter.group, -1.0) <= since

    def claimed(self, waiter: Waiter, queues: Collection[str], limit: int) -> None:
        """What the waiter's claim took (the queue of each todo, up to `limit`): a full claim
        rings the next waiter of each of those queues; a short one passes a fresh ring on."""
        with self._lock:
            self._claimed_at[waiter.group] = time.monotonic()
            ring, waiter.ring = waiter.ring, None
            if len(queues) >= limit:
                for queue in set(queues):
                    self._hand_out(Ring(queue, fresh=False))
            elif ring is not None and ring.fresh:
                self._hand_out(Ring(ring.queue, fresh=True, tried=ring.tried | {waiter.owner}))

    def leave(self, waiter: Waiter) -> None:
        """The long poll is over; a ring it had not claimed for goes to another waiter."""
        with self._lock:
            if waiter.idle_since is not None:
                self._stop_waiting(waiter)
            ring, waiter.ring = waiter.ring, None
            self._wanted.subtract(waiter.queues)
            for queue in waiter.queues:
                if not self._wanted[queue]:
                    del self._wanted[queue]
                    self._kept.pop(queue, None)
            if ring is not None:
                self._hand_out(ring)
            self._groups[waiter.group] -= 1
            if not self._groups[waiter.group]:
                del self._groups[waiter.group]
                self._claimed_at.pop(waiter.group, None)
            self._owners[waiter.owner] -= 1
            if not self._owners[waiter.owner]:
                del self._owners[waiter.owner]
                del self._turns[waiter.owner]
            if not self._owners and self.listener is not None:
                self.listener.unsubscribe(self)

    # The hand-out (called with the lock held)

    def _hand_out(self, ring: Ring) -> None:
        """Ring the idle waiter that wants `ring` whose owner's turn it is; or keep the ring
        for the waiters of its queue claiming now."""
        idle = self._idle if ring.queue is None else self._idle_in.get(ring.queue, {})
        chosen = min(
            (waiter for waiter in idle if waiter.owner not in ring.tried),
            key=lambda waiter: self._turns[waiter.owner],
            default=None,
        )
        if chosen is not None:
            self._ring(chosen, ring)
        elif ring.queue is not None and self._wanted[ring.queue] > len(idle):
            self._kept.setdefault(ring.queue, ring)

    def _ring(self, waiter: Waiter, ring: Ring) -> None:
        self._stop_waiting(waiter)
        waiter.ring = ring
        self._turns[waiter.owner] = next(self._rings)
        try:
            waiter.wake()
        except RuntimeError:  # its event loop is closed: the waiter is gone
            waiter.ring = None

    def _stop_waiting(self, waiter: Waiter) -> None:
        waiter.idle_since = None
        del self._idle[waiter]
        for queue in waiter.queues:
            idle = self._idle_in[queue]
            del idle[waiter]
            if not idle:
                del self._idle_in[queue]


class LongPoll:
    """One long poll of `owner` in `queues` of database `alias`: its waiter, deadline and
    polling schedule."""

    def __init__(
        self, alias: str, owner: str, queues: Iterable[str], seconds: float, *, listening: bool
    ) -> None:
        self.waiters = shared_waiters(alias, listening=listening)
        self.waiter = Waiter(owner, queues)
        listener = self.waiters.listener
        self._schedule = listen.PollSchedule(listen.POLL_MAX, [listener] if listener else [])
        self._deadline = time.monotonic() + seconds

    def join(self) -> None:
        """Join the waiters, blocking until notifications are heard (or CONNECT_TIMEOUT)."""
        if not self.waiters.join(self.waiter):
            self.waiters.listening_within(listen.CONNECT_TIMEOUT)

    async def ajoin(self) -> None:
        """`join`, suspended: a thread waits for the listener only when it is not listening."""
        if not self.waiters.join(self.waiter):
            await asyncio.get_running_loop().run_in_executor(
                None, self.waiters.listening_within, listen.CONNECT_TIMEOUT
            )

    def pause(self) -> float | None:
        """Seconds to wait before claiming again, or None when the wait is over."""
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            return None
        return min(remaining, self._schedule.pause())

    def wait(self, seconds: float) -> bool:
        """Block until rung or `seconds` pass; whether to claim now (`Waiters.woken`)."""
        rung = threading.Event()
        if not self.waiters.idle(self.waiter, rung.set):
            return True
        rung.wait(seconds)
        return self.waiters.woken(self.waiter)

    async def await_ring(self, seconds: float) -> bool:
        """`wait`, suspended."""
        loop = asyncio.get_running_loop()
        rung: asyncio.Future[None] = loop.create_future()
        if not self.waiters.idle(self.waiter, lambda: loop.call_soon_threadsafe(_resolve, rung)):
            return True
        await asyncio.wait([rung], timeout=seconds)
        return self.waiters.woken(self.waiter)

    def claimed(self, queues: Collection[str], limit: int) -> None:
        self.waiters.claimed(self.waiter, queues, limit)

    def leave(self) -> None:
        self.waiters.leave(self.waiter)


Job = tuple[concurrent.futures.Future[Any], Callable[[], Any]]


class ClaimThreads:
    """The threads that run the claims of async long polls, the owners taking turns.

    Started as claims come, up to `size`; a thread idle for `linger` seconds ends, closing its
    connections. Each keeps its connection from one claim to the next, closes one a database
    error left unusable, and gives a pooled one back to the pool once idle for
    KEEP_WHILE_IDLE seconds, or at once when another thread waits for the pool
    (thread_connections.py).
    """

    def __init__(self, size: int, linger: float) -> None:
        self._size = size
        self._linger = linger
        self._condition = threading.Condition()
        #: Claims waiting for a thread, by owner, taken in turns.
        self._queued: Lanes[Job] = Lanes()
        self._waiting_jobs = 0
        #: Threads taking claims, and how many of them wait for one.
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._stopping = False

    async def run(
        self, owner: str, function: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """`function(*args, **kwargs)` on one of the threads, in `owner`'s turn."""
        return await asyncio.wrap_future(
            self._queue(owner, functools.partial(function, *args, **kwargs))
        )

    def detach(self, owner: str, function: Callable[..., object], /, *args: Any) -> None:
        """`function(*args)` on one of the threads, in `owner`'s turn, awaited by nobody: for
        work that must happen though its caller is gone. An error is logged."""
        self._queue(owner, functools.partial(function, *args)).add_done_callback(_log_failure)

    def _queue(self, owner: str, call: Callable[[], R]) -> concurrent.futures.Future[R]:
        future: concurrent.futures.Future[R] = concurrent.futures.Future()
        with self._condition:
            self._queued.put(owner, (future, call))
            self._waiting_jobs += 1
            if self._idle:
                self._condition.notify()
            if self._waiting_jobs > self._idle and len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._work, name="switchboard-todos-claims", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        return future

    def stop(self, timeout: float = 5.0) -> None:
        """End every thread once its claim is done, closing its connections."""
        with self._condition:
            self._stopping = True
            threads = list(self._threads)
            self._condition.notify_all()
        try:
            for thread in threads:
                thread.join(timeout)
        finally:
            with self._condition:
                self._stopping = False

    def _work(self) -> None:
        try:
            keeping = False
            while (job := self._take(keeping)) is not None:
                if job is Idle.IDLE:
                    finish_with_connections()
                    keeping = False
                    continue
                future, call = job
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(call())
                    except BaseException as error:
                        future.set_exception(error)
                keep_connections()
                keeping = True
        finally:
            try:
                connections.close_all()
            finally:
                with self._condition:
                    if threading.current_thread() in self._threads:  # ended by an error
                        self._threads.remove(threading.current_thread())

    def _take(self, keeping: bool) -> Job | Idle | None:
        """The next claim, in the owners' turns; while `keeping` a connection, IDLE after
        KEEP_WHILE_IDLE seconds without one; None when this thread is to end: told to stop,
        or idle for `linger` seconds (it is then no longer counted)."""
        with self._condition:
            woken = True
            while not self._queued:
                if self._stopping or not woken:
                    self._threads.remove(threading.current_thread())
                    return None
                self._idle += 1
                woken = self._condition.wait(KEEP_WHILE_IDLE if keeping else self._linger)
                self._idle -= 1
                if keeping and not woken and not self._queued:
                    return Idle.IDLE
            self._waiting_jobs -= 1
            return self._queued.take()


async def cancellable_claim(owner: str, claim: Awaitable[R], give_back: Callable[[R], object]) -> R:
    """What `claim` (the claim of an async long poll, or of any async caller) claimed for
    `owner`. Cancelled while the claim runs on its thread, the caller is cancelled at once, the
    claim left to finish, and `give_back` called with what it took, on a claim thread."""
    running = asyncio.ensure_future(claim)
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        running.add_done_callback(functools.partial(_give_back, owner, give_back))
        raise


def _give_back(owner: str, give_back: Callable[[R], object], claim: asyncio.Future[R]) -> None:
    if not claim.cancelled() and claim.exception() is None:
        _claim_threads.detach(owner, give_back, claim.result())


def _log_failure(job: concurrent.futures.Future[object]) -> None:
    if not job.cancelled() and (error := job.exception()) is not None:
        logger.error("A detached job of the claim threads failed", exc_info=error)


_shared_waiters: dict[tuple[str, bool], Waiters] = {}
_shared_lock = threading.Lock()
_claim_threads = ClaimThreads(CLAIM_THREADS, CLAIM_THREAD_LINGER)


def shared_waiters(alias: str, *, listening: bool) -> Waiters:
    """The waiters of database `alias` in this process; with the shared listener if
    `listening`, else woken by their polls and each other only."""
    with _shared_lock:
        waiters = _shared_waiters.get((alias, listening))
        if waiters is None:
            listener = listen.shared_listener(alias) if listening else None
            waiters = _shared_waiters[alias, listening] = Waiters(listener)
        return waiters


def claim_threads() -> ClaimThreads:
    """The process's claim threads."""
    return _claim_threads


def stop() -> None:
    """End the claim threads and the shared listeners, closing their connections (tests,
    before their database is dropped)."""
    _claim_threads.stop()
    listen.stop_shared_listeners()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _nothing() -> None:
    pass
