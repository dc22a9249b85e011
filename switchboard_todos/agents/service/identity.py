"""Who is calling: the active agent a bearer token belongs to."""

from __future__ import annotations

from typing import Any

from django.db import connections, router

from switchboard_todos import cursors
from switchboard_todos.agents import errors, tokens
from switchboard_todos.agents.service.twins import twin
from switchboard_todos.exceptions import NotAuthenticated
from switchboard_todos.models import Agent
from switchboard_todos.sql import agent_queries


def authenticate(token: str | None) -> Agent:
    """The active agent holding `token`, or NotAuthenticated; one statement (two for a token
    that is refused)."""
    check_shape(token)
    assert token is not None
    token_hash = tokens.token_hash(token)
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


def check_shape(token: str | None) -> None:
    """Refuse a missing or malformed token, without the database (NotAuthenticated)."""
    if not token:
        raise NotAuthenticated(errors.NO_TOKEN)
    if not isinstance(token, str) or not tokens.well_formed(token):
        raise NotAuthenticated("Unknown token.")


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
