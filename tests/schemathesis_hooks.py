"""Schemathesis hooks for tests/test_api_schema.py (loaded through SCHEMATHESIS_HOOKS)."""

from __future__ import annotations

from typing import Any

import schemathesis

#: The longest wait a read sends, in seconds. A read of a todo that does not end waits its
#: whole `wait` (up to 20 s): a run of them would take many minutes and fail the response time
#: check. Waits the schema refuses are sent as generated (some as text, by the coverage phase).
LONGEST = 0.2


@schemathesis.hook
def before_call(context: schemathesis.HookContext, case: Any, kwargs: dict[str, Any]) -> None:
    """Shorten a valid `wait` of GET todos/{todo_id}/, in every phase; a wait that the todo's
    end cuts short is tried in tests/test_api_live.py."""
    try:
        wait = float(case.query["wait"])
    except (TypeError, KeyError, ValueError):
        return
    if LONGEST < wait <= 20:
        case.query["wait"] = LONGEST
