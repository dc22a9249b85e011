"""Instant wake-up on new work: one LISTEN connection fanned out to the waiters of a process.

The statements of `sql/` that make todos claimable right now send
`NOTIFY switchboard_todos, '<queue>'`, delivered when their transaction commits. A `Listener`
holds one dedicated connection that LISTENs on that channel and tells each subscriber which
queue has new work: a worker's `Doorbell`, or the `Waiters` of the long polls (long_polls.py),
which hand the wake-up to one of them. It also LISTENs for the end of the todos someone waits
for (`wait_for`, endings.py) and tells their `Ending`s. Waiters also poll: a todo whose retry
time arrives or whose lease expires sends no notification, nor does anything committed while
the listener was reconnecting. Without LISTEN (PgBouncer in transaction mode cannot deliver
notifications) everything still works, at polling latency.

Behind a connection pooler the listener connects where SWITCHBOARD_TODOS_LISTEN_URL says, past
the pooler. It refuses to listen through a pooler unless SWITCHBOARD_TODOS_POOLER = "session"
says the pooler keeps sessions: in transaction mode the LISTEN would stay on a server connection
that other clients then use, and this one would wait for notifications that never come (a
`wait_for` for its whole wait). Its subscribers then poll, and one error says which setting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections
from django.db import Error as DatabaseError
from django.db.utils import load_backend

from switchboard_todos import pooling
from switchboard_todos.conf import conf

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger("switchboard_todos.listen")

#: The NOTIFY channel of the statements in `sql/`; the payload is the queue name.
CHANNEL = "switchboard_todos"
#: The channel of the todos someone waits for (wait_for, endings.py); the payload is the id.
ENDED_CHANNEL = "switchboard_todos_done"
#: Polling without LISTEN starts this fast after work was seen, then doubles up to the cap.
POLL_MIN = 0.05
#: The cap of a long poll's polling: how late it sees a retry come due or a lease expire.
POLL_MAX = 1.0
#: How long `subscribe` waits for the listening connection before falling back to polling.
CONNECT_TIMEOUT = 5.0
#: How often the listener thread looks up from its connection to check whether to stop.
_TICK = 0.25
_RECONNECT_MAX = 5.0


class _Refused(Exception):
    """The listening connection reached a pooler that may not keep its LISTEN."""


class Subscriber(Protocol):
    """What a `Listener` tells: new work in a queue, or anything may have been missed."""

    def notify(self, queue: str) -> None:
        """A statement made todos of `queue` claimable."""

    def ring_all(self) -> None:
        """The connection came back: notifications may have been lost meanwhile."""


class Ending(Protocol):
    """What a `Listener` tells of a todo someone waits for."""

    def end(self) -> None:
        """The todo ended; or the connection came back and the notification may be lost."""


class Doorbell:
    """Wakes the threads of a worker waiting for work in some queues, one per ring.

    A ring nobody is waiting for is kept (up to `capacity`), so work that arrives between a
    waiter's empty claim and its wait is not missed. `news` is the monotonic time of the last
    notification it wanted: what a busy worker compares with its last claim (worker/claiming.py,
    the express claim).
    """

    def __init__(
        self,
        queues: Iterable[str],
        *,
        capacity: int = 1,
        wants: Callable[[str], bool] | None = None,
    ) -> None:
        self.queues = frozenset(queues)
        #: Whether a notification for a queue rings this doorbell (default: one of `queues`).
        self.wants = wants or self.queues.__contains__
        self._capacity = capacity
        self._rings = 0
        self._condition = threading.Condition()
        self.news = 0.0

    def notify(self, queue: str) -> None:
        """Ring once for new work in a queue it `wants`."""
        if self.wants(queue):
            self.news = time.monotonic()
            self.ring()

    def ring(self, count: int = 1) -> None:
        """Wake up to `count` waiters, or keep the rings for the next ones."""
        with self._condition:
            self._rings = min(self._capacity, self._rings + count)
            self._condition.notify(count)

    def ring_all(self) -> None:
        """Wake every waiter (after a reconnect, or to stop)."""
        self.ring(self._capacity)

    def wait(self, timeout: float) -> bool:
        """Block until rung or `timeout` seconds pass; True if rung."""
        with self._condition:
            if not self._rings:
                self._condition.wait(timeout)
            if self._rings:
                self._rings -= 1
                return True
            return False


class PollSchedule:
    """How long to wait between claims that found nothing.

    While `listeners` listen (one per database), notifications bring new work at once and
    polling only finds retries coming due and expired leases: every `maximum` seconds. Without
    them, polling is the only way, so it starts at POLL_MIN and doubles up to `maximum`.
    """

    def __init__(self, maximum: float, listeners: Sequence[Listener]) -> None:
        self._maximum = maximum
        self._listeners = listeners
        self._next = min(POLL_MIN, maximum)

    def reset(self) -> None:
        """Work was found: poll fast again."""
        self._next = min(POLL_MIN, self._maximum)

    def pause(self) -> float:
        """The next wait, in seconds."""
        if self._listeners and all(listener.listening for listener in self._listeners):
            return self._maximum
        pause = self._next
        self._next = min(pause * 2, self._maximum)
        return pause


class Listener:
    """One LISTEN connection to database `alias`, on a thread, telling its subscribers.

    The thread starts with the first subscriber and reconnects with backoff when the
    connection drops, ringing every subscriber once it listens again. It stops `linger` seconds
    after the last subscriber left, or at `stop()`.
    """

    def __init__(self, alias: str = DEFAULT_DB_ALIAS, *, linger: float = 0.0) -> None:
        self.alias = alias
        self._linger = linger
        self._lock = threading.Lock()
        self._subscribers: set[Subscriber] = set()
        self._endings: dict[str, set[Ending]] = {}
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._listening = threading.Event()
        #: Set once listening, or once refused (`_refused`): what `listening_within` waits for.
        self._settled = threading.Event()
        self._refused = False

    @property
    def listening(self) -> bool:
        """Whether notifications are being received right now."""
        return self._listening.is_set()

    def subscribe(self, subscriber: Subscriber, *, timeout: float = CONNECT_TIMEOUT) -> bool:
        """Tell `subscriber` of every notification; True once listening.

        Waits up to `timeout` for the connection: work committed after a True return is
        always notified.
        """
        with self._lock:
            self._subscribers.add(subscriber)
            self._start()
        return self.listening_within(timeout)

    def watch(self, todo_id: str, ending: Ending, *, timeout: float = CONNECT_TIMEOUT) -> bool:
        """Tell `ending` when todo `todo_id` ends; True once listening (see `subscribe`)."""
        with self._lock:
            self._endings.setdefault(todo_id, set()).add(ending)
            self._start()
        return self.listening_within(timeout)

    def unwatch(self, todo_id: str, ending: Ending) -> None:
        """Stop telling `ending`."""
        with self._lock:
            watching = self._endings.get(todo_id, set())
            watching.discard(ending)
            if not watching:
                self._endings.pop(todo_id, None)

    def _start(self) -> None:
        """Start the thread, unless it runs (under the lock)."""
        if self._thread is None and not self._refused:
            self._stopping.clear()
            self._thread = threading.Thread(
                target=self._run, name=f"switchboard-todos-listener-{self.alias}", daemon=True
            )
            self._thread.start()

    def listening_within(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the connection to listen; whether it does. False
        at once if the listener refused to listen through a pooler."""
        self._settled.wait(timeout)
        return self.listening

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """Stop telling `subscriber`."""
        with self._lock:
            self._subscribers.discard(subscriber)

    def stop(self, timeout: float = 5.0) -> None:
        """Close the connection and end the thread, whoever is subscribed."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            self._stopping.set()
            thread.join(timeout)
        with self._lock:
            self._refused = False
            self._settled.clear()

    def _run(self) -> None:
        wrapper: BaseDatabaseWrapper | None = None
        failures = 0
        idle_since: float | None = None
        try:
            while True:
                with self._lock:
                    if self._subscribers or self._endings:
                        idle_since = None
                    elif idle_since is None:
                        idle_since = time.monotonic()
                    done = self._stopping.is_set() or (
                        idle_since is not None and time.monotonic() - idle_since >= self._linger
                    )
                    if done:
                        self._thread = None
                        self._listening.clear()
                        self._settled.clear()
                        return
                try:
                    if wrapper is None:
                        wrapper = self._connect(reconnect=failures > 0)
                        failures = 0
                    for notify in wrapper.connection.notifies(timeout=_TICK):
                        self._dispatch(notify.channel, notify.payload)
                except _Refused as refusal:
                    logger.error("%s", refusal)
                    with self._lock:
                        self._refused = True
                        self._thread = None
                        self._settled.set()
                    return
                except (DatabaseError, psycopg.Error) as error:
                    with self._lock:
                        self._listening.clear()
                        self._settled.clear()
                    failures += 1
                    delay = min(_RECONNECT_MAX, 0.1 * 2**failures)
                    # One warning per outage; the retries of a long one say nothing more.
                    logger.log(
                        logging.WARNING if failures == 1 else logging.DEBUG,
                        "LISTEN connection lost (%s); reconnecting in %.1fs",
                        error,
                        delay,
                    )
                    _close(wrapper)
                    wrapper = None
                    self._stopping.wait(delay)
        finally:
            _close(wrapper)

    def _connect(self, *, reconnect: bool) -> BaseDatabaseWrapper:
        bypass = pooling.listen_settings(self.alias)
        wrapper = (
            connections.create_connection(self.alias)
            if bypass is None
            else load_backend(bypass["ENGINE"]).DatabaseWrapper(bypass, self.alias)
        )
        try:
            wrapper.ensure_connection()
            if conf.POOLER != "session" and pooling.pooled(wrapper.connection):
                raise _Refused(
                    f"Not listening on database {self.alias!r}: it is reached through a "
                    "connection pooler, which in transaction mode would keep the LISTEN on a "
                    "server connection other clients use, and deliver nothing here. Waiters "
                    'poll instead. Set SWITCHBOARD_TODOS_POOLER ("transaction", or "session" '
                    "for a pooler that keeps sessions), or a SWITCHBOARD_TODOS_LISTEN_URL past "
                    'the pooler (docs/operating.md, "Behind a connection pooler").'
                )
            # LISTEN takes effect at commit: run it outside any transaction.
            wrapper.set_autocommit(True)
            wrapper.connection.execute(f"LISTEN {CHANNEL}; LISTEN {ENDED_CHANNEL}")
        except BaseException:
            _close(wrapper)
            raise
        with self._lock:
            self._listening.set()
            self._settled.set()
            subscribers = list(self._subscribers)
            endings = [ending for watching in self._endings.values() for ending in watching]
        if reconnect:
            logger.info("LISTEN connection restored")
            for subscriber in subscribers:
                subscriber.ring_all()
            for ending in endings:
                ending.end()
        return wrapper

    def _dispatch(self, channel: str, payload: str) -> None:
        with self._lock:
            if channel == ENDED_CHANNEL:
                endings = list(self._endings.get(payload, ()))
                subscribers = []
            else:
                endings = []
                subscribers = list(self._subscribers)
        for ending in endings:
            ending.end()
        for subscriber in subscribers:
            subscriber.notify(payload)


def _close(wrapper: BaseDatabaseWrapper | None) -> None:
    if wrapper is None:
        return
    try:
        # A pooled connection goes back to the pool: it must not keep listening there.
        if wrapper.connection is not None and not wrapper.connection.closed:
            wrapper.connection.execute("UNLISTEN *")
    except psycopg.Error:
        pass  # the connection is gone: nothing listens on it any more
    try:
        wrapper.close()
    except DatabaseError:
        logger.debug("Closing the LISTEN connection failed", exc_info=True)


_shared: dict[str, Listener] = {}
_shared_lock = threading.Lock()
#: The shared listener keeps its connection this long after the last waiter, so a stream of
#: long polls does not reconnect for each (the claim threads of long_polls.py linger as long).
SHARED_LINGER = 10.0


def shared_listener(alias: str = DEFAULT_DB_ALIAS) -> Listener:
    """The process-wide listener of database `alias` that the long polls' waiters subscribe to."""
    with _shared_lock:
        if alias not in _shared:
            _shared[alias] = Listener(alias, linger=SHARED_LINGER)
        return _shared[alias]


def stop_shared_listeners() -> None:
    """Close every shared listener's connection (tests, before dropping their database)."""
    with _shared_lock:
        listeners = list(_shared.values())
    for listener in listeners:
        listener.stop()
