"""Settings, read from `SWITCHBOARD_TODOS_*` at first use (not at import), then kept.

A changed setting (override_settings, pytest-django's `settings`) is read again: Django sends
`setting_changed`. Keeping them matters on the hot paths, where each read of an unset setting
would cost Django's AttributeError fallback. Values are checked by the system checks in
`checks.py`; the properties only apply defaults.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS

DEFAULTS: dict[str, Any] = {
    # Retry backoff after `fail`: BASE * 2**(attempt-1) seconds, at most MAX, minus up to
    # JITTER (a fraction of the delay) at random.
    "BACKOFF_BASE": 5.0,
    "BACKOFF_MAX": 3600.0,
    "BACKOFF_JITTER": 0.5,
    # Largest payload, result or error accepted, in bytes of JSON.
    "MAX_JSON_BYTES": 1024 * 1024,
    # The connection pooler between the app and PostgreSQL: None, "transaction" or "session"
    # (docs/operating.md, "Behind a connection pooler"). It gives LISTEN, PREPARE and
    # GENERIC_PLANS their defaults (POOLED_DEFAULTS), and decides what the app may leave on a
    # server connection.
    "POOLER": None,
    # A libpq connection string (URL or key=value) for the LISTEN connection, which then
    # bypasses the pooler; what it leaves out comes from the database's DATABASES entry. A
    # dict maps database aliases to theirs.
    "LISTEN_URL": None,
    # Wake idle workers and long polls through LISTEN/NOTIFY; off behind a transaction
    # pooler, which cannot deliver notifications (they then poll).
    "LISTEN": True,
    # Prepare the manager's statements once per connection (see cursors.py); off behind a
    # PgBouncer in transaction mode older than 1.21, which cannot keep prepared statements.
    "PREPARE": True,
    # Run the prepared statements on one generic plan (plan_cache_mode = force_generic_plan on
    # the connections they run on): PostgreSQL's own choice planned the claim anew at every call.
    "GENERIC_PLANS": True,
    # The health page and todo_stats warn when a transaction has held back vacuum (the xmin
    # horizon) for longer than this many seconds, or the todos table holds more dead rows.
    "HORIZON_WARNING_AGE": 300.0,
    "DEAD_TUPLES_WARNING": 100_000,
    # Connection timeouts of the worker's and reaper's connections, over faults.py's defaults
    # (a value of None drops one): libpq parameters, and server settings sent with -c.
    "DATABASE_OPTIONS": {},
    # A todo's failure history keeps its last MAX_ERRORS_KEPT entries, within
    # MAX_ERROR_HISTORY_BYTES of JSON (the newest entry always), and counts the ones it
    # dropped; each entry's error is trimmed to MAX_ERROR_BYTES of JSON.
    "MAX_ERRORS_KEPT": 20,
    "MAX_ERROR_HISTORY_BYTES": 256 * 1024,
    "MAX_ERROR_BYTES": 64 * 1024,
    # Largest progress note a heartbeat stores, in bytes of JSON.
    "MAX_PROGRESS_BYTES": 16 * 1024,
    # Most expired leases one statement of the reaper takes back: one short transaction each.
    "REAP_BATCH": 1000,
    # The lease, in seconds, of a claim that gives none, in a queue with no visibility timeout
    # of its own (the Queue row's), as SQS's default visibility timeout.
    "DEFAULT_TTL": 30.0,
    # What one remote agent may take, unless its own row says otherwise (the Agent's fields):
    # long polls at once (the long-poll cap, per server process), MCP sessions open at once (per
    # process), requests in flight at once (per process, long polls included: twice the
    # long-poll cap, so that an agent with every long poll waiting can still heartbeat and
    # complete what they bring), todos held at once, todos created per minute, and the highest
    # max_attempts it may give a todo.
    "AGENT_MAX_WAITS": 8,
    # Longest an MCP task (a task-augmented create_for or create_many) is kept, in seconds:
    # the most a client's `ttl` gets, and what a task without one gets. Its todo is not purged
    # before then, whatever the retention.
    "TASK_TTL_MAX": 7 * 24 * 3600,
    "AGENT_MAX_SESSIONS": 8,
    "AGENT_MAX_CONCURRENT": 16,
    "AGENT_MAX_HELD": 100,
    "AGENT_MAX_CREATES_PER_MINUTE": 600,
    "AGENT_MAX_ATTEMPTS": 25,
    # Bytes of JSON one remote agent may write a minute (payloads, results, errors, progress
    # notes), unless its own row says otherwise: 600 creates of 27 KiB, or 256 errors of the
    # most that is stored of one (MAX_ERROR_BYTES).
    "AGENT_MAX_BYTES_PER_MINUTE": 16 * 1024 * 1024,
    # Todos one remote agent may fail or release a minute, unless its own row says otherwise:
    # each puts a todo back to be claimed again, as a creation adds one, so the default is the
    # quota of creations. Without it, an agent failing its own todos (retry_in 0) as fast as it
    # can claim them took nine tenths of the server from the others (docs/benchmarks.md).
    "AGENT_MAX_FAILS_PER_MINUTE": 600,
    # The quotas a minute (creations, bytes, fails) are paced, unless the agent's own row says
    # otherwise: at most this many seconds' worth of a minute's quota at once (and at least one
    # write's worth), refilled continuously at the quota's rate. A burst of a whole minute's
    # creations or bytes in its first second was the other agents' p99 (docs/benchmarks.md);
    # 60 lets a minute's quota go at once.
    "AGENT_BURST_SECONDS": 6.0,
    # Seconds a server process keeps what it read of an agent (its grants and quotas) for the
    # verbs whose own statement checks the agent's credential (the HTTP API's claims from
    # queues, heartbeat, complete, fail, release; SQS's receive, delete and visibility
    # changes): one statement a request instead of two. A revoked or rotated credential is
    # refused at its very next request whatever this is; a changed grant or quota is seen
    # within it. 0: every request reads the agent.
    "AGENT_CACHE_SECONDS": 10.0,
}


#: The values of LISTEN, PREPARE and GENERIC_PLANS that SWITCHBOARD_TODOS_POOLER implies where
#: the project sets none: a transaction pooler hands each transaction to any server connection,
#: so nothing may be left on one. Set explicitly, LISTEN and PREPARE win (LISTEN with a
#: LISTEN_URL, PREPARE on a pooler that keeps prepared statements, PgBouncer 1.21+);
#: GENERIC_PLANS cannot (a session setting): it stays off behind a transaction pooler.
POOLED_DEFAULTS: dict[str | None, dict[str, bool]] = {
    "transaction": {"LISTEN": False, "PREPARE": False, "GENERIC_PLANS": False},
}

#: The values SWITCHBOARD_TODOS_POOLER accepts.
POOLERS = (None, "transaction", "session")


class Settings:
    """Typed, lazily read view of the `SWITCHBOARD_TODOS_*` settings."""

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}

    def _get(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            value = getattr(settings, f"SWITCHBOARD_TODOS_{name}", DEFAULTS[name])
            self._values[name] = value
            return value

    def forget(self) -> None:
        """Read every setting again at its next use."""
        self._values.clear()

    @property
    def BACKOFF_BASE(self) -> float:
        return float(self._get("BACKOFF_BASE"))

    @property
    def BACKOFF_MAX(self) -> float:
        return float(self._get("BACKOFF_MAX"))

    @property
    def BACKOFF_JITTER(self) -> float:
        return float(self._get("BACKOFF_JITTER"))

    @property
    def MAX_JSON_BYTES(self) -> int:
        return int(self._get("MAX_JSON_BYTES"))

    def _pooled(self, name: str) -> bool:
        """A setting POOLER gives a default: the project's value, else the pooler's, else ours."""
        try:
            return bool(self._values[name])
        except KeyError:
            implied = POOLED_DEFAULTS.get(self.POOLER, {}).get(name, DEFAULTS[name])
            if name == "LISTEN" and self.LISTEN_URL:
                implied = True  # its connection bypasses the pooler
            value = getattr(settings, f"SWITCHBOARD_TODOS_{name}", implied)
            self._values[name] = value
            return bool(value)

    @property
    def POOLER(self) -> str | None:
        value = self._get("POOLER")
        return None if value is None else str(value)

    @property
    def LISTEN_URL(self) -> str | dict[str, str] | None:
        value = self._get("LISTEN_URL")
        return value or None

    def listen_url(self, alias: str) -> str | None:
        """The LISTEN connection string of database `alias`, if it has one."""
        url = self.LISTEN_URL
        if isinstance(url, dict):
            return url.get(alias)
        return url if alias == DEFAULT_DB_ALIAS else None

    @property
    def LISTEN(self) -> bool:
        return self._pooled("LISTEN")

    @property
    def PREPARE(self) -> bool:
        return self._pooled("PREPARE")

    @property
    def GENERIC_PLANS(self) -> bool:
        if self.POOLER == "transaction":
            return False
        return self._pooled("GENERIC_PLANS")

    @property
    def HORIZON_WARNING_AGE(self) -> float:
        return float(self._get("HORIZON_WARNING_AGE"))

    @property
    def DEAD_TUPLES_WARNING(self) -> int:
        return int(self._get("DEAD_TUPLES_WARNING"))

    @property
    def DATABASE_OPTIONS(self) -> dict[str, Any]:
        return dict(self._get("DATABASE_OPTIONS"))

    @property
    def MAX_ERRORS_KEPT(self) -> int:
        return int(self._get("MAX_ERRORS_KEPT"))

    @property
    def MAX_ERROR_HISTORY_BYTES(self) -> int:
        return int(self._get("MAX_ERROR_HISTORY_BYTES"))

    @property
    def MAX_ERROR_BYTES(self) -> int:
        return int(self._get("MAX_ERROR_BYTES"))

    @property
    def MAX_PROGRESS_BYTES(self) -> int:
        return int(self._get("MAX_PROGRESS_BYTES"))

    @property
    def REAP_BATCH(self) -> int:
        return int(self._get("REAP_BATCH"))

    @property
    def DEFAULT_TTL(self) -> float:
        return float(self._get("DEFAULT_TTL"))

    @property
    def AGENT_MAX_WAITS(self) -> int:
        return int(self._get("AGENT_MAX_WAITS"))

    @property
    def AGENT_CACHE_SECONDS(self) -> float:
        return float(self._get("AGENT_CACHE_SECONDS"))

    @property
    def TASK_TTL_MAX(self) -> int:
        return int(self._get("TASK_TTL_MAX"))

    @property
    def AGENT_MAX_SESSIONS(self) -> int:
        return int(self._get("AGENT_MAX_SESSIONS"))

    @property
    def AGENT_MAX_CONCURRENT(self) -> int:
        return int(self._get("AGENT_MAX_CONCURRENT"))

    @property
    def AGENT_MAX_HELD(self) -> int:
        return int(self._get("AGENT_MAX_HELD"))

    @property
    def AGENT_MAX_CREATES_PER_MINUTE(self) -> int:
        return int(self._get("AGENT_MAX_CREATES_PER_MINUTE"))

    @property
    def AGENT_MAX_ATTEMPTS(self) -> int:
        return int(self._get("AGENT_MAX_ATTEMPTS"))

    @property
    def AGENT_MAX_BYTES_PER_MINUTE(self) -> int:
        return int(self._get("AGENT_MAX_BYTES_PER_MINUTE"))

    @property
    def AGENT_MAX_FAILS_PER_MINUTE(self) -> int:
        return int(self._get("AGENT_MAX_FAILS_PER_MINUTE"))

    @property
    def AGENT_BURST_SECONDS(self) -> float:
        return float(self._get("AGENT_BURST_SECONDS"))


conf = Settings()


def _setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting.startswith("SWITCHBOARD_TODOS_"):
        conf.forget()


setting_changed.connect(_setting_changed)
