"""Creating agents and changing their tokens: what the admin and `manage.py todo_agent` share.

Each returns the new token, which exists nowhere else: show it once, then it is gone.

Credentials stay dead. Every new token comes with a new credential salt, which the agent's SQS
secret is derived from (sqs/signing.py): an agent deleted and created again under the same
name gets a new secret. Revocation destroys both: the stored hash becomes a mark no token
hashes to (kept only to tell the revoked token's holder that it was revoked), and the salt is
new. So whatever makes a revoked agent active again, its old token and secret never work
again; `rotate_token` is how an operator re-activates one, with a token shown once.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

from django.core.exceptions import ValidationError
from django.db.models import Case, F, TextField, Value, When
from django.db.models.functions import Concat

from switchboard_todos import validation
from switchboard_todos.agents.tokens import REVOKED, issue_token
from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.models import Agent, agent_name_validator

#: Quotas fit for a kind of agent, as Agent fields; `todo_agent create/limits --preset NAME`
#: sets them (docs/agents.md#quota-presets). `broker`: the agent Celery or dramatiq sends and
#: receives as over SQS (docs/celery.md), the project's own producers rather than a tenant.
#: 500 creations a second, five times the rate the measured server ran Celery tasks at end to
#: end, stop a runaway loop rather than a busy project; 256 MiB a minute is 8 KiB a message at
#: that rate (a small Celery task's is 1.3 KiB); 1,000 held leaves room for the workers'
#: prefetch and for the countdown and ETA tasks they hold until due. The max_attempts limit
#: stays: SQS senders give none.
QUOTA_PRESETS: dict[str, dict[str, int]] = {
    "broker": {
        "max_held": 1_000,
        "max_creates_per_minute": 30_000,
        "max_bytes_per_minute": 256 * 1024 * 1024,
        # Messages given back (ChangeMessageVisibility 0, a rejected task requeued): as many
        # as it may send, not a tenant's share.
        "max_fails_per_minute": 30_000,
        # The project's own producer: a minute's quotas at once, as a Celery group publishes.
        "burst_seconds": 60,
    },
}


def create_agent(
    name: str, *, claim_queues: Iterable[str] = (), create_queues: Iterable[str] = ()
) -> tuple[Agent, str]:
    """A new active agent with the queues it may claim from and create in; (agent, token)."""
    try:
        agent_name_validator(name)
    except ValidationError as error:
        raise InvalidTodo(f"Agent name {name!r}: {' '.join(error.messages)}") from None
    if Agent.objects.filter(name=name).exists():
        raise InvalidTodo(f"Agent {name!r} exists already; rotate its token instead.")
    issued = issue_token()
    agent = Agent.objects.create(
        name=name,
        claim_queues=_queues(claim_queues),
        create_queues=_queues(create_queues),
        token_hash=issued.hash,
        token_prefix=issued.prefix,
    )
    return agent, issued.token


def rotate_token(agent: Agent) -> str:
    """Give `agent` a new token and make it active; the old token stops working at once."""
    issued = issue_token()
    Agent.objects.filter(pk=agent.pk).update(
        token_hash=issued.hash,
        token_prefix=issued.prefix,
        token_generation=F("token_generation") + 1,
        credential_salt=secrets.token_hex(),
        is_active=True,
    )
    agent.refresh_from_db()
    return issued.token


def revoke(agent: Agent) -> None:
    """Refuse `agent`'s token and SQS secret from now on, for good (its leases expire as any
    worker's do); only `rotate_token` gives it credentials again."""
    Agent.objects.filter(pk=agent.pk).update(
        token_hash=Case(
            When(token_hash__startswith=REVOKED, then="token_hash"),
            default=Concat(Value(REVOKED), "token_hash", output_field=TextField()),
        ),
        credential_salt=secrets.token_hex(),
        is_active=False,
    )
    agent.refresh_from_db()


def _queues(names: Iterable[str]) -> list[str]:
    names = list(names)
    return validation.queues(names) if names else []
