"""The `todo_agents` table: the remote agents, their tokens' hashes and their quotas."""

from __future__ import annotations

import secrets

from django.contrib.postgres.fields import ArrayField
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models.functions import Cast
from django.utils.translation import gettext_lazy as _

from switchboard_todos.models.defaults import db_now, db_random_uuid
from switchboard_todos.models.validators import agent_name_validator, validate_queue_names


class Agent(models.Model):
    """A remote agent (HTTP, MCP): its name is the owner of what it claims, its token its key.

    Only a hash of the token is stored (see agents/tokens.py); `token_prefix` is its first
    characters, enough for a person to tell which token a log line or a leak is about.
    """

    name = models.TextField(validators=[agent_name_validator])
    claim_queues = ArrayField(
        models.TextField(),
        default=list,
        blank=True,
        validators=[validate_queue_names],
        help_text=_("Queues it may claim from, separated by commas."),
    )
    create_queues = ArrayField(
        models.TextField(),
        default=list,
        blank=True,
        validators=[validate_queue_names],
        help_text=_("Queues it may create todos in, separated by commas."),
    )
    is_active = models.BooleanField(default=True, help_text=_("Unset to revoke its token."))
    token_prefix = models.TextField(editable=False)
    token_hash = models.TextField(editable=False)
    #: Bumped at every rotation: credentials derived from the token can tell old from new.
    token_generation = models.IntegerField(default=1, editable=False)
    created_at = models.DateTimeField(db_default=db_now(), editable=False)
    #: Updated at most once a minute by the requests the agent makes.
    last_seen_at = models.DateTimeField(null=True, blank=True, editable=False)
    #: Random, new with every token: what credentials derived from the token (SQS secrets) mix
    #: in, so that a deleted or revoked agent's stay dead.
    credential_salt = models.TextField(
        default=secrets.token_hex,
        db_default=Cast(db_random_uuid(), models.TextField()),
        editable=False,
    )
    # Quotas; empty takes the project's default (SWITCHBOARD_TODOS_AGENT_*).
    max_held = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=_("Most todos it may hold at once; empty: SWITCHBOARD_TODOS_AGENT_MAX_HELD."),
    )
    max_creates_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=_(
            "Most todos it may create per minute; empty: "
            "SWITCHBOARD_TODOS_AGENT_MAX_CREATES_PER_MINUTE."
        ),
    )
    max_attempts_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=_(
            "The highest max_attempts it may give a todo; empty: "
            "SWITCHBOARD_TODOS_AGENT_MAX_ATTEMPTS."
        ),
    )
    max_bytes_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=_(
            "Most bytes of JSON (payloads, results, errors, progress notes) it may write per "
            "minute; empty: SWITCHBOARD_TODOS_AGENT_MAX_BYTES_PER_MINUTE."
        ),
    )
    max_fails_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=_(
            "Most todos it may fail or release per minute (each puts a todo back in its queue); "
            "empty: SWITCHBOARD_TODOS_AGENT_MAX_FAILS_PER_MINUTE."
        ),
    )
    burst_seconds = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(60)],
        help_text=_(
            "Most seconds' worth of its quotas a minute it may spend at once (1 to 60); empty: "
            "SWITCHBOARD_TODOS_AGENT_BURST_SECONDS."
        ),
    )
    #: The paced quotas (count_writes, sql/agents.sql): the time until which its creations, its
    #: bytes of JSON and its fails and releases are paid for at the quota's rate; empty or past:
    #: nothing owed.
    creates_paid_until = models.DateTimeField(null=True, blank=True, editable=False)
    bytes_paid_until = models.DateTimeField(null=True, blank=True, editable=False)
    fails_paid_until = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        db_table = "todo_agents"
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["name"], name="todo_agents_name_key"),
            # Every request looks its agent up by this hash.
            models.UniqueConstraint(fields=["token_hash"], name="todo_agents_token_key"),
        ]

    def __str__(self) -> str:
        return self.name
