"""Counts of what each agent has under way at once in this server process, each held to a
setting: its requests in flight (request_cap.py) and, among them, its long polls
(long_poll_cap.py).

A count is taken once the agent is known and before its request runs a statement of its own
(in front of Django's handler, api/asgi.py: before its token is even looked up); past the cap
the agent is told to slow down (Throttled: HTTP 429 with Retry-After, SQS
RequestThrottled, an MCP tool error that says when to try again) and nothing is run for it.
The counts are of this process: behind a balancer with N processes an agent may have N times a
cap under way, each process bounding its own.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from switchboard_todos.exceptions import Throttled

#: How long an agent past a cap is asked to wait before trying again, in seconds: what it has
#: under way is short (a statement or two) or, for a long poll, ends within its wait.
RETRY_AFTER = 1


class AgentCap:
    """One count per agent name, at most `limit()` at once; `refusal(who, cap)` says why not
    (`who`: "Agent 'name'", or "This token's agent" before its credential was looked up).

    An agent counted with a credential (its token's hash) is known by that credential for as
    long as it has anything under way, so that `refuse_known` can refuse its next request
    before the credential is looked up in the database.

    A request may be counted before that lookup (`admitted_early`): under its agent when the
    credential is known, else under the credential itself. Once a credential is known, every
    request counted under it is counted under its agent instead, and the agent's `admitted`
    inside a request counted early does not count it again: each request is counted once, and
    the cap bounds an agent's requests whether or not their credential was known yet.
    """

    def __init__(self, limit: Callable[[], int], refusal: Callable[[str, int], str]) -> None:
        self._limit = limit
        self._refusal = refusal
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._names: dict[str, str] = {}
        self._credentials: dict[str, set[str]] = {}
        #: The credential of the request running in this context, if it was counted early.
        self._early: ContextVar[str | None] = ContextVar(f"early-{id(self)}", default=None)

    @contextmanager
    def admitted(self, name: str, credential: str | None = None) -> Iterator[None]:
        """Count one more for agent `name` while the block runs, or raise Throttled when it has
        `limit()` under way already (a request counted early with `credential`: when its
        credential's requests would take the agent past it)."""
        cap = self._limit()
        early = credential is not None and self._early.get() == credential
        with self._lock:
            if not (early and credential is not None and self._key(credential) == name):
                self._count(name, credential, early, cap)
        if early:
            yield  # released where it was counted
            return
        try:
            yield
        finally:
            with self._lock:
                self._release(name)

    @contextmanager
    def admitted_early(self, credential: str) -> Iterator[None]:
        """Count a request carrying `credential` while the block runs, before the credential is
        looked up; or raise Throttled when its agent (or, not known, the credential) has
        `limit()` under way already."""
        cap = self._limit()
        with self._lock:
            key = self._key(credential)
            if self._counts[key] >= cap:
                who = "This token's agent" if key == credential else f"Agent {key!r}"
                raise Throttled(self._refusal(who, cap), retry_after=RETRY_AFTER)
            self._counts[key] += 1
        reset = self._early.set(credential)
        try:
            yield
        finally:
            self._early.reset(reset)
            with self._lock:
                self._release(self._key(credential))

    def refuse_known(self, credential: str) -> None:
        """Raise Throttled when `credential` is that of an agent with `limit()` under way (not
        for a request counted early with it: that was checked as it was counted)."""
        if self._early.get() == credential:
            return
        cap = self._limit()
        with self._lock:
            name = self._names.get(credential)
            if name is not None and self._counts[name] >= cap:
                raise Throttled(self._refusal(f"Agent {name!r}", cap), retry_after=RETRY_AFTER)

    def _count(self, name: str, credential: str | None, early: bool, cap: int) -> None:
        """Count agent `name`'s request, and the requests counted under `credential` while it
        was not known (a request counted early is among them already)."""
        waiting = self._counts[credential] if credential is not None else 0
        # Counted early under another agent the credential was known as (renamed since).
        elsewhere = early and credential is not None and self._key(credential) != credential
        if self._counts[name] + waiting - (early and not elsewhere) >= cap:
            raise Throttled(self._refusal(f"Agent {name!r}", cap), retry_after=RETRY_AFTER)
        if elsewhere:
            assert credential is not None
            self._release(self._key(credential))
        self._counts[name] += waiting + (not early or elsewhere)
        if credential is not None:
            del self._counts[credential]
            self._names[credential] = name
            self._credentials.setdefault(name, set()).add(credential)

    def _key(self, credential: str) -> str:
        """What a request carrying `credential` is counted under: its agent, once known."""
        return self._names.get(credential, credential)

    def _release(self, key: str) -> None:
        self._counts[key] -= 1
        if not self._counts[key]:
            del self._counts[key]
            for known in self._credentials.pop(key, ()):
                if self._names.get(known) == key:  # not since taken by another
                    del self._names[known]
