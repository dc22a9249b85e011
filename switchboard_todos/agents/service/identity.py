"""Who is calling: the active agent a bearer token (or an SQS access key) belongs to.

`authenticate` reads the agent at every call: one statement. `recognise` is for the verbs whose
own statement checks the agent's credential (claims from queues, heartbeat, complete, fail,
release: their `credential_holds` guard, sql/shared.sql): it answers with the agent as this
process read it at most SWITCHBOARD_TODOS_AGENT_CACHE_SECONDS ago, so that such a request is
one statement, not two. Revocation stays exact: a revoked or rotated credential's salt no
longer matches, the verb's statement acts on nothing, and the service then `check`s the
credential and refuses it (NotAuthenticated), forgetting what it had read. What can be
seconds old is only what the agent may do (its grants and quotas), as an operator changed it.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from django.db import connections, router

from switchboard_todos import cursors
from switchboard_todos.agents import errors, tokens
from switchboard_todos.agents.service.twins import twin
from switchboard_todos.conf import conf
from switchboard_todos.exceptions import NotAuthenticated
from switchboard_todos.models import Agent
from switchboard_todos.sql import agent_queries

#: Most agents one process keeps read (`recognise`); past it, what has expired is dropped
#: first, then the oldest.
MAX_RECOGNISED = 1024


class _Read(NamedTuple):
    agent: Agent
    until: float


#: What `recognise` read, by token hash (or "sqs:" and the access key id), until when.
_recognised: dict[str, _Read] = {}


def authenticate(token: str | None) -> Agent:
    """The active agent holding `token`, or NotAuthenticated; one statement (two for a token
    that is refused)."""
    check_shape(token)
    assert token is not None
    return _authenticated(tokens.token_hash(token))


def recognise(token: str | None) -> Agent:
    """`authenticate`, answered from what this process read of the agent within
    SWITCHBOARD_TODOS_AGENT_CACHE_SECONDS: only for a verb whose statement is given
    `credential(agent, alias)` and which `check`s the credential when it acts on nothing."""
    check_shape(token)
    assert token is not None
    token_hash = tokens.token_hash(token)
    agent = _read_lately(token_hash)
    if agent is None:
        agent = _authenticated(token_hash)
        _remember(token_hash, agent)
    return agent


def recognised(token: str | None) -> Agent | None:
    """What `recognise` answers without the database: the agent this process read within
    SWITCHBOARD_TODOS_AGENT_CACHE_SECONDS, else None. For a caller on the event loop, which
    then needs no thread for it (MCP's holder calls)."""
    check_shape(token)
    assert token is not None
    return _read_lately(tokens.token_hash(token))


def _read_lately(key: str) -> Agent | None:
    read = _recognised.get(key)
    return read.agent if read is not None and read.until > time.monotonic() else None


def recognise_named(name: str) -> Agent | None:
    """The active agent named `name` (an SQS access key id), as `recognise` reads it; None when
    there is none. `forget_named` drops it, so that a signature made with a credential newer
    than the one read is checked against the agent as it is now."""
    key = f"sqs:{name}"
    agent = _read_lately(key)
    if agent is not None:
        return agent
    agent = Agent.objects.filter(name=name, is_active=True).first()
    if agent is not None:
        _remember(key, agent)
    return agent


def forget_named(name: str) -> None:
    _recognised.pop(f"sqs:{name}", None)


def forget() -> None:
    """Forget every agent read: each is read again at its next request."""
    _recognised.clear()


def credential(agent: Agent, alias: str) -> str | None:
    """What a verb's statement in database `alias` checks of `agent`'s credential: its salt,
    where the agents' table is (one database, or the agents' own). In any other database the
    credential is checked first, by a statement of its own, and the verb's statement checks
    nothing."""
    if alias == router.db_for_write(Agent):
        return agent.credential_salt
    check(agent)
    return None


def check(agent: Agent) -> None:
    """Refuse `agent` (NotAuthenticated) unless it is still active under the credential it was
    read with, and forget what was read of it: its next request reads it again. One
    statement."""
    alias = router.db_for_write(Agent)
    with cursors.cursor(connections[alias]) as cursor:
        cursor.execute(
            agent_queries["check_credential"],
            {"name": agent.name, "credential": agent.credential_salt},
        )
        row = cursor.fetchone()
    if row is None or not row[0]:
        for key, read in tuple(_recognised.items()):  # a copy: other threads change it
            if read.agent.name == agent.name:
                _recognised.pop(key, None)
        raise NotAuthenticated(f"The credentials of agent {agent.name!r} were revoked or rotated.")


def check_shape(token: str | None) -> None:
    """Refuse a missing or malformed token, without the database (NotAuthenticated)."""
    if not token:
        raise NotAuthenticated(errors.NO_TOKEN)
    if not isinstance(token, str) or not tokens.well_formed(token):
        raise NotAuthenticated("Unknown token.")


def _authenticated(token_hash: str) -> Agent:
    agent = _agent_by_hash(token_hash)
    if agent is None:
        revoked = Agent.objects.filter(token_hash=tokens.REVOKED + token_hash)
        name = revoked.values_list("name", flat=True).first()
        if name is None:
            raise NotAuthenticated("Unknown token.")
        raise NotAuthenticated(f"The token of agent {name!r} was revoked.")
    if not agent.is_active:
        raise NotAuthenticated(f"The token of agent {agent.name!r} was revoked.")
    return agent


def _remember(key: str, agent: Agent) -> None:
    seconds = conf.AGENT_CACHE_SECONDS
    if seconds <= 0:
        return
    now = time.monotonic()
    if len(_recognised) >= MAX_RECOGNISED:
        for stale, read in tuple(_recognised.items()):
            if read.until <= now:
                _recognised.pop(stale, None)
        while len(_recognised) >= MAX_RECOGNISED:
            _recognised.pop(next(iter(tuple(_recognised))), None)
    _recognised[key] = _Read(agent, now + seconds)


def _agent_by_hash(token_hash: str) -> Agent | None:
    """Run `authenticate` (agents.sql): the agent, marked seen at most once a minute."""
    alias = router.db_for_write(Agent)
    with cursors.cursor(connections[alias]) as cursor:
        cursor.execute(agent_queries["authenticate"], {"token_hash": token_hash})
        row = cursor.fetchone()
        if row is None:
            return None
        names = [(name or b"").decode() for name in cursors.column_names(cursor)]
    values: dict[str | None, Any] = dict(zip(names, row, strict=True))
    fields = Agent._meta.concrete_fields
    return Agent.from_db(
        alias, [field.attname for field in fields], [values[field.column] for field in fields]
    )


aauthenticate = twin(authenticate)
arecognise = twin(recognise)
