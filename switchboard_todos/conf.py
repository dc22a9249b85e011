"""Settings, read from `SWITCHBOARD_TODOS_*` at use (not at import), so override_settings works.

Values are checked by the system checks in `checks.py`; the properties only apply defaults.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # Retry backoff after `fail`: BASE * 2**(attempt-1) seconds, at most MAX, minus up to
    # JITTER (a fraction of the delay) at random.
    "BACKOFF_BASE": 5.0,
    "BACKOFF_MAX": 3600.0,
    "BACKOFF_JITTER": 0.5,
    # Largest payload, result or error accepted, in bytes of JSON.
    "MAX_JSON_BYTES": 1024 * 1024,
    # Wake waiting workers and blocking claims through LISTEN/NOTIFY; turn off behind a
    # transaction-pooling PgBouncer, which cannot deliver notifications (they then poll).
    "LISTEN": True,
}


class Settings:
    """Typed, lazily read view of the `SWITCHBOARD_TODOS_*` settings."""

    def _get(self, name: str) -> Any:
        return getattr(settings, f"SWITCHBOARD_TODOS_{name}", DEFAULTS[name])

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


conf = Settings()
