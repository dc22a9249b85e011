"""What an agent does with a todo it holds: heartbeat, complete, fail, release.

The owner of every transition is the agent's name, never a value from the request; a conflict
over a todo the agent may not see answers as an unknown id does (TodoNotFound).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from switchboard_todos import validation
from switchboard_todos.agents.service import identity, quotas, visibility
from switchboard_todos.agents.service.twins import twin
from switchboard_todos.exceptions import TodoConflict, TodoNotFound
from switchboard_todos.managers import Receipt, TodoManager
from switchboard_todos.models import Agent, Todo
from switchboard_todos.validation import Seconds


def heartbeat(
    agent: Agent,
    todo_id: str,
    ttl: Seconds | None,
    progress: Any = None,
    *,
    receipt: Receipt | None = None,
) -> Todo:
    """Extend the lease on a todo the agent holds to `ttl` from now; `progress` (any JSON
    value) becomes its latest progress note. TodoCancelled: an operator cancelled it. With a
    `receipt`, only under that claim (SQS's receipt handles)."""
    checked = validation.arguments(ttl=ttl, progress=progress)
    note = _checked(checked["progress"])
    return _as_holder(
        agent,
        todo_id,
        note,
        lambda todos, held: todos.heartbeat(
            held,
            agent.name,
            checked["ttl"],
            progress=note,
            receipt=receipt,
            credential=identity.credential(agent, todos.db),
        ),
    )


def complete(
    agent: Agent, todo_id: str, result: Any = None, *, receipt: Receipt | None = None
) -> Todo:
    """Mark a todo the agent holds done, with `result` (any JSON value); with a `receipt`, only
    under that claim."""
    text = _checked(validation.result(result))
    return _as_holder(
        agent,
        todo_id,
        text,
        lambda todos, held: todos.complete(
            held, agent.name, text, receipt=receipt, credential=identity.credential(agent, todos.db)
        ),
    )


def fail(agent: Agent, todo_id: str, error: Any = None, retry_in: Seconds | None = None) -> Todo:
    """Record a failed attempt: retried after a backoff (or `retry_in`), dead letter at the cap.
    Counted against the agent's quota of fails a minute first."""
    checked = validation.arguments(error=error, retry_in=retry_in)
    text = _checked(checked["error"])
    return _as_holder(
        agent,
        todo_id,
        text,
        lambda todos, held: todos.fail(
            held,
            agent.name,
            text,
            checked["retry_in"],
            credential=identity.credential(agent, todos.db),
        ),
        puts_back=True,
    )


def release(
    agent: Agent, todo_id: str, delay: Seconds | None = None, *, receipt: Receipt | None = None
) -> Todo:
    """Give the lease back, claimable again after `delay`; the attempt is not counted, the
    release is (against the agent's quota of fails and releases a minute). With a `receipt`,
    only under that claim."""
    return _as_holder(
        agent,
        todo_id,
        None,
        lambda todos, held: todos.release(
            held,
            agent.name,
            delay,
            receipt=receipt,
            credential=identity.credential(agent, todos.db),
        ),
        puts_back=True,
    )


def _checked(text: str | None) -> validation.JsonText | None:
    """The JSON a verb writes, checked here already: the manager takes it as it is."""
    return None if text is None else validation.JsonText(text)


def _as_holder(
    agent: Agent,
    todo_id: str,
    written: str | None,
    transition: Callable[[TodoManager, str], Todo],
    *,
    puts_back: bool = False,
) -> Todo:
    """Run a holder's transition, once the JSON it writes (`written`) is counted against the
    agent's quota of bytes, and a transition that `puts_back` the todo (a fail, a release)
    against its quota of those (quotas.count_bytes, count_fail; counted, whatever the
    transition answers); a conflict over a todo the agent may not see is a 404. The
    transition's statement checks the agent's credential (identity.credential): when it acted
    on nothing, the credential is checked before the miss is explained, so a revoked agent
    learns that first.

    With several databases, the todo is first looked for (one query per database).
    """
    checked = visibility.todo_id(todo_id)
    if puts_back:
        quotas.count_fail(agent, written)
    else:
        quotas.count_bytes(agent, written)
    aliases = visibility.databases(agent)
    if len(aliases) > 1:
        found = [
            alias for alias in aliases if Todo.objects.using(alias).filter(pk=checked).exists()
        ]
        if not found:
            raise TodoNotFound(checked)
        aliases = found
    todos = Todo.objects.db_manager(aliases[0])
    try:
        return transition(todos, checked)
    except TodoNotFound:
        identity.check(agent)
        raise
    except TodoConflict:
        identity.check(agent)
        if not todos.filter(visibility.visible_to(agent), pk=checked).exists():
            raise TodoNotFound(checked) from None
        raise


aheartbeat = twin(heartbeat)
acomplete = twin(complete)
afail = twin(fail)
arelease = twin(release)
