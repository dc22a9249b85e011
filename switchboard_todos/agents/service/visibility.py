"""What an agent may see and claim: the queues granted to it, the todos it may see, and the
databases they live in.

An agent sees the todos of its claim queues not assigned to another agent, and the todos it
holds; it reads (`get_todo`) these and the todos it created too; any other todo answers exactly
as an unknown id does (TodoNotFound), so that an agent cannot learn what other queues hold.
With queues in several databases (placement.py), its verbs run in the databases its claim
queues live in (its reads, in its create queues' too).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import router
from django.db.models import Q

from switchboard_todos import placement, validation
from switchboard_todos.exceptions import QueueNotGranted
from switchboard_todos.models import Agent, Todo


def databases(agent: Agent) -> list[str]:
    """The databases the agent's claim queues live in (the router's, if it has none)."""
    return list(placement.by_database(agent.claim_queues)) or [router.db_for_write(Todo)]


def read_databases(agent: Agent) -> list[str]:
    """The databases of the todos the agent may read: its claim queues' and its create queues'."""
    queues = [*agent.claim_queues, *agent.create_queues]
    return list(placement.by_database(queues)) or [router.db_for_write(Todo)]


def claimable_by(agent: Agent) -> Q:
    """Todos not assigned to another agent."""
    return Q(assignee__isnull=True) | Q(assignee=agent.name)


def visible_to(agent: Agent) -> Q:
    """The todos an agent may see: those it may claim from its queues, and those it holds."""
    return Q(owner=agent.name) | claimable_by(agent) & Q(queue__in=agent.claim_queues)


def readable_by(agent: Agent) -> Q:
    """The todos an agent may read: those it sees, and those it created (to follow work it
    handed to others, wherever it went)."""
    return visible_to(agent) | Q(source=source(agent))


def source(agent: Agent) -> str:
    """The source of the todos an agent creates, and the scope of its keys."""
    return f"agent:{agent.name}"


def sees(agent: Agent, todo: Todo) -> bool:
    """Whether `visible_to(agent)` takes `todo`, for a todo in hand."""
    return todo.owner == agent.name or (
        todo.assignee in (None, agent.name) and todo.queue in agent.claim_queues
    )


def claim_queues(agent: Agent, queues: Iterable[str] | None) -> list[str]:
    """The queues asked for, each granted to the agent for claiming; all of them by default."""
    if queues is None:
        if not agent.claim_queues:
            raise QueueNotGranted(f"Agent {agent.name!r} may not claim from any queue.")
        return list(agent.claim_queues)
    names = validation.queues(queues)
    for name in names:
        if name not in agent.claim_queues:
            raise QueueNotGranted(f"Agent {agent.name!r} may not claim from queue {name!r}.")
    return names


def todo_id(value: object) -> str:
    """A todo id as given, checked (InvalidTodo for one that no todo could have)."""
    return validation.text(value, "todo id", validation.TODO_ID_MAX_LENGTH, required=True)
