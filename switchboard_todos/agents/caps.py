"""Counts of what each agent has under way at once in this server process, each held to a
setting: its requests in flight (request_cap.py) and, among them, its long polls
(long_poll_cap.py).

A count is taken once the agent is known and before its request runs a statement of its own;
past the cap the agent is told to slow down (Throttled: HTTP 429 with Retry-After, SQS
RequestThrottled, an MCP tool error that says when to try again) and nothing is run for it.
The counts are of this process: behind a balancer with N processes an agent may have N times a
cap under way, each process bounding its own.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from switchboard_todos.exceptions import Throttled

#: How long an agent past a cap is asked to wait before trying again, in seconds: what it has
#: under way is short (a statement or two) or, for a long poll, ends within its wait.
RETRY_AFTER = 1


class AgentCap:
    """One count per agent name, at most `limit()` at once; `refusal(name, cap)` says why not.

    An agent counted with a credential (its token's hash) is known by that credential for as
    long as it has anything under way, so that `refuse_known` can refuse its next request
    before the credential is looked up in the database.
    """

    def __init__(self, limit: Callable[[], int], refusal: Callable[[str, int], str]) -> None:
        self._limit = limit
        self._refusal = refusal
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._names: dict[str, str] = {}
        self._credentials: dict[str, set[str]] = {}

    @contextmanager
    def admitted(self, name: str, credential: str | None = None) -> Iterator[None]:
        """Count one more for agent `name` while the block runs, or raise Throttled when it has
        `limit()` under way already."""
        cap = self._limit()
        with self._lock:
            self._refuse_at(cap, name)
            self._counts[name] += 1
            if credential is not None:
                self._names[credential] = name
                self._credentials.setdefault(name, set()).add(credential)
        try:
            yield
        finally:
            with self._lock:
                self._counts[name] -= 1
                if not self._counts[name]:
                    del self._counts[name]
                    for known in self._credentials.pop(name, ()):
                        if self._names.get(known) == name:  # not since taken by another
                            del self._names[known]

    def refuse_known(self, credential: str) -> None:
        """Raise Throttled when `credential` is that of an agent with `limit()` under way."""
        cap = self._limit()
        with self._lock:
            name = self._names.get(credential)
            if name is not None:
                self._refuse_at(cap, name)

    def _refuse_at(self, cap: int, name: str) -> None:
        if self._counts[name] >= cap:
            raise Throttled(self._refusal(name, cap), retry_after=RETRY_AFTER)
