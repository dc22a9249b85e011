"""Django signals for the todo lifecycle, sent only while a receiver is connected.

Each is sent with `sender=Todo`, `todos` (the Todos the statement changed, as it returned them)
and `operation` (the manager method, e.g. "fail" or "reap_expired"), once per statement, never
per row. They are sent right after the statement, inside the caller's transaction if there is
one, like post_save: a receiver with side effects outside the database should use
`transaction.on_commit`. A receiver that raises is logged and does not undo the transition.

When no receiver is connected, a transition pays one cached `has_listeners()` lookup per signal
it could send.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db.models import prefetch_related_objects
from django.dispatch import Signal

if TYPE_CHECKING:
    from switchboard_todos.models import Todo

logger = logging.getLogger(__name__)

todo_created = Signal(use_caching=True)
"""New todos (not the live todo an idempotency key returned; enqueue_many sends none)."""
todo_claimed = Signal(use_caching=True)
"""Todos claimed by `claim_next`, `claim_batch` or `claim`, now held by their owner."""
todo_completed = Signal(use_caching=True)
"""Todos marked done by `complete` or `complete_many`."""
todo_failed = Signal(use_caching=True)
"""Todos whose attempt failed (`fail`): pending again for a retry, or dead-lettered at the cap."""
todo_dead_lettered = Signal(use_caching=True)
"""Todos that became dead letters: at the attempt cap (`fail`, the reaper) or by `cancel`."""
todo_requeued = Signal(use_caching=True)
"""Dead letters an operator sent back to pending (`requeue`, `requeue_many`)."""
todo_lease_expired = Signal(use_caching=True)
"""Todos whose lease expired: taken back by the reaper, or claimed again by a claim scan."""
todo_lease_lapsed = todo_lease_expired
"""The earlier name of `todo_lease_expired`, the same signal, kept so that receivers connected
through it still hear every expired lease."""

LIFECYCLE = (
    todo_created,
    todo_claimed,
    todo_completed,
    todo_failed,
    todo_dead_lettered,
    todo_requeued,
    todo_lease_expired,
)

Pick = Callable[["Todo", Any], bool]


def _every(todo: Todo, extra: Any) -> bool:
    return True


def _created(todo: Todo, created: Any) -> bool:
    return bool(created)


def _dead_letter(todo: Todo, extra: Any) -> bool:
    return todo.state == "failed"


def _took_over_an_expired_lease(todo: Todo, extra: Any) -> bool:
    """A claim that took an expired lease over records the expiry at the claim's own time.

    (A todo the reaper took back earlier in the same transaction as its claim, whose now() is
    the same, would be told twice: transactions do not reap and claim together in practice.)
    """
    history = todo.errors
    last = history[-1] if history else None
    return (
        isinstance(last, dict)
        and last.get("error", {}).get("type") == "LeaseExpired"
        and todo.claimed_at is not None
        and datetime.fromisoformat(last["at"]) == todo.claimed_at
    )


#: What each statement's returned todos send: (signal, which of the todos). One table, read by
#: the manager wherever the rows of a transition come back.
SENT_BY: dict[str, tuple[tuple[Signal, Pick], ...]] = {
    "create_todo": ((todo_created, _created),),
    "create_child": ((todo_created, _created),),
    "create_many": ((todo_created, _created),),
    "create_graph": ((todo_created, _created),),
    "tick_schedule": ((todo_created, _every),),
    "claim_next": ((todo_claimed, _every), (todo_lease_expired, _took_over_an_expired_lease)),
    "claim": ((todo_claimed, _every), (todo_lease_expired, _took_over_an_expired_lease)),
    "claim_filtered": ((todo_claimed, _every), (todo_lease_expired, _took_over_an_expired_lease)),
    "complete": ((todo_completed, _every),),
    "complete_many": ((todo_completed, _every),),
    "fail": ((todo_failed, _every), (todo_dead_lettered, _dead_letter)),
    "reap_expired": ((todo_lease_expired, _every), (todo_dead_lettered, _dead_letter)),
    "requeue": ((todo_requeued, _every),),
    "cancel": ((todo_dead_lettered, _every),),
}


def listened(statement: str, sender: type[Todo]) -> bool:
    """Whether any signal `statement` can send has a receiver: else there is nothing to do."""
    return any(signal.has_listeners(sender) for signal, _ in SENT_BY.get(statement, ()))


def send(statement: str, sender: type[Todo], rows: Sequence[tuple[Todo, Any]]) -> None:
    """Send each signal of `statement` that has receivers, with the todos it concerns."""
    for signal, pick in SENT_BY.get(statement, ()):
        if not signal.has_listeners(sender):
            continue
        if pick is _took_over_an_expired_lease:
            from switchboard_todos.models import known_history  # models imports this module

            # The failure histories of the claimed todos that have one, in one query, not one
            # per todo.
            prefetch_related_objects(
                [todo for todo, _ in rows if known_history(todo) is None], "error_entries"
            )
        todos = [todo for todo, extra in rows if pick(todo, extra)]
        if not todos:
            continue
        for receiver, outcome in signal.send_robust(sender, todos=todos, operation=statement):
            if isinstance(outcome, Exception):
                logger.error(
                    "A receiver of a todo signal raised; the transition stands: %r",
                    receiver,
                    exc_info=outcome,
                )
