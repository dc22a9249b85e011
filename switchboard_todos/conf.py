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

DEFAULTS: dict[str, Any] = {
    # Retry backoff after `fail`: BASE * 2**(attempt-1) seconds, at most MAX, minus up to
    # JITTER (a fraction of the delay) at random.
    "BACKOFF_BASE": 5.0,
    "BACKOFF_MAX": 3600.0,
    "BACKOFF_JITTER": 0.5,
    # Largest payload, result or error accepted, in bytes of JSON.
    "MAX_JSON_BYTES": 1024 * 1024,
    # Wake idle workers and long polls through LISTEN/NOTIFY; turn off behind a
    # transaction-pooling PgBouncer, which cannot deliver notifications (they then poll).
    "LISTEN": True,
    # Prepare the manager's statements once per connection (see cursors.py); turn off behind a
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
}


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

    @property
    def LISTEN(self) -> bool:
        return bool(self._get("LISTEN"))

    @property
    def PREPARE(self) -> bool:
        return bool(self._get("PREPARE"))

    @property
    def GENERIC_PLANS(self) -> bool:
        return bool(self._get("GENERIC_PLANS"))

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


conf = Settings()


def _setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting.startswith("SWITCHBOARD_TODOS_"):
        conf.forget()


setting_changed.connect(_setting_changed)
