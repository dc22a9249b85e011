"""Faults of the database, told apart from faults of a todo, and outlived with a backoff.

A todo's fault fails that todo. A fault of the database fails every statement alike until it
passes: the server gone or restarting, a connection cut or timed out, a statement or lock
timeout, or the database turned read-only by a failover to a standby. The worker and the
reaper then back off exponentially with jitter, log one line when the fault begins and one
when it ends, and carry on; nothing about it is stored on a todo.

The worker's and reaper's connections also get timeouts (`DATABASE_OPTIONS`), so that a
frozen server or a dead network is noticed instead of waited on forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections

from switchboard_todos.backoff import retry_delay
from switchboard_todos.conf import conf

logger = logging.getLogger(__name__)

#: SQLSTATE read_only_sql_transaction: a standby, or default_transaction_read_only = on.
READ_ONLY = "25006"
#: The libpq parameters among DATABASE_OPTIONS; the others are server settings, sent with `-c`.
LIBPQ_PARAMETERS = frozenset(
    {"connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval",
     "keepalives_count", "tcp_user_timeout"}
)  # fmt: skip


class DatabaseUnavailable(Exception):
    """A statement failed for a fault of the database, which no todo is to blame for.

    `delay` is how long the outage's backoff asks to wait before the next statement.
    """

    def __init__(self, what: str, delay: float) -> None:
        super().__init__(f"{what}: the database is unavailable")
        self.delay = delay


def is_outage(error: BaseException) -> bool:
    """Whether `error` is a fault of the database rather than of the statement's input."""
    if isinstance(error, OperationalError | InterfaceError):
        return True
    return isinstance(error, DatabaseError) and _sqlstate(error) == READ_ONLY


def _sqlstate(error: BaseException) -> str | None:
    return getattr(error.__cause__, "sqlstate", None) or getattr(error, "sqlstate", None)


#: What PgBouncer (before 1.20) answers a connection that sends server settings in `options`.
POOLER_REFUSAL = "unsupported startup parameter"


def one_line(error: BaseException) -> str:
    """The error's message on one line (psycopg's span several); a pooler's refusal of the
    worker's server settings says which setting to set."""
    try:
        text = str(error)
    except Exception:
        text = ""
    line = " ".join(text.split()) or type(error).__name__
    if POOLER_REFUSAL in line and conf.POOLER is None:
        line += (
            " (a connection pooler refused the server settings of DATABASE_OPTIONS: set "
            'SWITCHBOARD_TODOS_POOLER, docs/operating.md "Behind a connection pooler")'
        )
    return line


class Outage:
    """One process's view of a database fault: since when, how long to back off, what to log.

    Shared by the threads of a worker: the first failure logs that the database is away, the
    first success after it logs that it is back, and the failures between say nothing.
    """

    def __init__(self, name: str, *, base: float = 0.5, cap: float = 30.0) -> None:
        self.name = name
        self.base = base
        self.cap = cap
        self._lock = threading.Lock()
        self._since: float | None = None
        self._failures = 0

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def failed(self, what: str, error: BaseException) -> float:
        """Record a statement that failed for `error`; return how long to wait before the next."""
        with self._lock:
            self._failures += 1
            if self._since is None:
                self._since = time.monotonic()
                read_only = _sqlstate(error) == READ_ONLY
                logger.warning(
                    "%s: the database is %s (%s: %s); backing off until it is back",
                    self.name,
                    "read-only" if read_only else "unavailable",
                    what,
                    one_line(error),
                )
            return retry_delay(self._failures, base=self.base, cap=self.cap, jitter=0.5)

    def passed(self) -> None:
        """Record a statement that succeeded; log the end of the outage if there was one."""
        if self._since is None:  # the hot path: no lock
            return
        with self._lock:
            if self._since is None:
                return
            logger.warning(
                "%s: the database is back after %.1fs (%d failed statements)",
                self.name,
                time.monotonic() - self._since,
                self._failures,
            )
            self._since = None
            self._failures = 0


def connection_options() -> dict[str, Any]:
    """DATABASE_OPTIONS: the defaults, with the project's values over them (None drops one).

    Behind a pooler (SWITCHBOARD_TODOS_POOLER) the default server settings are left out: they
    go in the startup packet's `options`, for which PgBouncer before 1.20 refuses the
    connection ("unsupported startup parameter: options"), and which a transaction pooler
    could not keep per client anyway. Set them for the role there (docs/operating.md).
    """
    defaults = {
        name: value
        for name, value in DEFAULT_DATABASE_OPTIONS.items()
        if conf.POOLER is None or name in LIBPQ_PARAMETERS
    }
    options = {**defaults, **conf.DATABASE_OPTIONS}
    return {name: value for name, value in options.items() if value is not None}


#: The worker's and reaper's connection timeouts (docs/operating.md, section 10).
DEFAULT_DATABASE_OPTIONS: dict[str, Any] = {
    "connect_timeout": 10,  # seconds to connect: a frozen server accepts, then never answers
    "keepalives": 1,  # TCP keepalives notice a dead server or network in about a minute
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    "tcp_user_timeout": 60_000,  # ms that sent data may stay unacknowledged
    "statement_timeout": "5min",  # the queue's statements take milliseconds
    "lock_timeout": "30s",  # a row held locked elsewhere fails the statement, to be retried
}


@contextmanager
def timeouts(alias: str) -> Iterator[None]:
    """Give the connections opened to `alias` inside the block the DATABASE_OPTIONS.

    The project's own DATABASES OPTIONS win over them. They apply to the worker's and the
    reaper's processes only, and to what a handler runs on its thread's connection.
    """
    settings_dict = connections.settings[alias]
    saved = settings_dict.get("OPTIONS")
    settings_dict["OPTIONS"] = with_timeouts(dict(saved or {}), connection_options())
    try:
        yield
    finally:
        if saved is None:
            settings_dict.pop("OPTIONS", None)
        else:
            settings_dict["OPTIONS"] = saved


def with_timeouts(options: dict[str, Any], timeouts: dict[str, Any]) -> dict[str, Any]:
    """`options` (a DATABASES OPTIONS dict) with `timeouts` added where it sets none."""
    server = options.get("options", "")
    for name, value in timeouts.items():
        if name in LIBPQ_PARAMETERS:
            options.setdefault(name, value)
        elif name not in server:
            server = f"{server} -c {name}={value}".strip()
    if server:
        options["options"] = server
    return options
