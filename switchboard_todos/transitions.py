"""The todo state machine in one table: its states, and one row per transition.

A row says which states the transition's guard accepts, what else in the guard can stand in
the way and how to say so, and, for an operator repair, its permission and how the admin offers
it. The manager explains every miss from these rows (TodoConflict, and a batch's reasons), the
admin offers and gates its repairs with them, and the health page lists them. The guard itself
is the SQL block of the same name in its family's file of `sql/`;
`tests/test_transition_table.py` holds each row against it. Adding a transition: one SQL block,
one row here, one manager method.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import models
from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _

from switchboard_todos.exceptions import TodoCancelled, TodoConflict

DEFAULT_MAX_ATTEMPTS = 5
"""Attempts a todo gets unless it is created with its own `max_attempts` or its queue has a
default (Queue.max_attempts): its last failure, or its last lease expiring, makes it a dead
letter."""


class State(models.TextChoices):
    """Where a todo is in its life; the CHECK constraint on `todos.state` allows exactly these."""

    PENDING = "pending", _("Pending")
    """Waiting for a claim, and not claimable before `next_retry_at`. Left only by a claim."""

    CLAIMED = "claimed", _("Claimed")
    """Held by `owner` until `lease_expires_at`. Left by complete, fail, release, or the lease
    expiring (the reaper or the next claim scan)."""

    DONE = "done", _("Done")
    """Completed by its owner; `result` holds what it returned. Final: left only by purging."""

    FAILED = "failed", _("Failed (dead letter)")
    """Dead-lettered after `max_attempts` attempts, or cancelled by an operator. Left only by an
    operator's requeue."""


#: What the guarded statements saw of a todo: a row of the `classify_miss` statement.
Seen = Mapping[str, Any]


@dataclass(frozen=True)
class Obstacle:
    """A part of a guard besides the state, and how to say it stood in the way."""

    stands: Callable[[Seen, str | None], bool]
    """Given what was seen and the caller (the owner, for owner-guarded transitions)."""
    conflict: str
    """The TodoConflict message: a template over the seen row's columns and `caller`."""
    refusal: str = ""
    """For a transition with a batch form: the reason, without the id (so that refusals group)."""
    error: type[TodoConflict] = TodoConflict
    """The exception that tells the caller."""


@dataclass(frozen=True)
class Repair:
    """An operator repair: what the admin needs to offer it, each under its own permission."""

    permission: str
    """The codename of the permission (Todo.Meta.permissions) it needs, in app switchboard_todos."""
    permission_name: str
    label: Promise
    """The button on a todo's page."""
    explanation: Promise
    done: str
    """Past tense, for the counts: "requeued"."""


@dataclass(frozen=True)
class Transition:
    """One transition: the guard of its SQL block, and how a miss of it is explained."""

    name: str
    """The SQL block's name and the manager method's (with `_many`, the batch form)."""
    from_states: frozenset[State]
    """The states the statement's guard accepts (none: it inserts)."""
    wrong_state: str = ""
    """The TodoConflict message for a todo in another state (a template, as Obstacle's); empty
    for the transitions that report no miss (a claim that finds nothing returns nothing)."""
    obstacles: tuple[Obstacle, ...] = ()
    """The rest of the guard, in the order a miss is explained."""
    ended_by: tuple[Obstacle, ...] = ()
    """What may have taken the todo out of the from-states under the caller, explained before
    the state: an operator's cancel, which its holder must hear of as such."""
    not_in_state: str = ""
    """With a batch form: its reason for a todo in another state, "it is done, <not_in_state>"."""
    repair: Repair | None = None
    method: str = ""
    """The manager method that runs the statement, when it is not the one of its name (a
    variant of it for a case the method meets: `create_child` for `create_todo(after=...)`)."""

    @property
    def owner_guarded(self) -> bool:
        """Whether the caller must hold the todo (`owner = %(owner)s` in the guard)."""
        return NOT_HELD in self.obstacles

    def conflict(self, seen: Seen, caller: str | None) -> str:
        """Say, in the terms of this transition, why its guard did not match the seen todo."""
        standing = self._standing(seen, caller)
        if standing is not None:
            template = standing.conflict
        else:
            template = CHANGED if seen["state"] in self.from_states else self.wrong_state
        return template.format(**seen, caller=caller, operation=self.name)

    def error(self, seen: Seen, caller: str | None) -> type[TodoConflict]:
        """The TodoConflict (or subclass: TodoCancelled) that tells the caller of the miss."""
        standing = self._standing(seen, caller)
        return TodoConflict if standing is None else standing.error

    def _standing(self, seen: Seen, caller: str | None) -> Obstacle | None:
        """The first part of the guard that explains the miss, if any does."""
        obstacles = self.ended_by
        if seen["state"] in self.from_states:
            obstacles += self.obstacles
        return next((item for item in obstacles if item.stands(seen, caller)), None)

    def refusal(self, seen: Seen | None) -> str:
        """Say briefly, without the id, why a batch of this transition left a todo alone."""
        if seen is None:
            return "it does not exist"
        if seen["state"] not in self.from_states:
            return f"it is {seen['state']}, {self.not_in_state}"
        standing = [obstacle.refusal for obstacle in self.obstacles if obstacle.stands(seen, None)]
        return standing[0] if standing else "it changed while the operation ran; try again"


#: A miss that nothing seen explains: the todo changed between the statement and the look.
CHANGED = "Todo {id} changed while {operation} ran; try again."

NOT_HELD = Obstacle(
    stands=lambda seen, caller: seen["owner"] != caller,
    conflict="Todo {id} is claimed by {owner!r}, not by {caller!r}.",
)
NOT_CLAIMED = "Todo {id} is {state}, not claimed; {operation} needs it claimed by {caller!r}."
#: The holder's todo was cancelled by an operator (the `cancel` statement's cancelled_hold).
CANCELLED = Obstacle(
    stands=lambda seen, caller: seen["cancelled_hold"] and seen["owner"] == caller,
    conflict=(
        "Todo {id} was cancelled by an operator while {caller!r} held it ({cancel_reason}): stop "
        "work on it; {operation} is refused."
    ),
    error=TodoCancelled,
)

_ASSIGNED_ELSEWHERE = Obstacle(
    stands=lambda seen, caller: seen["assignee"] not in (None, caller),
    conflict="Todo {id} is assigned to {assignee!r}; {caller!r} may not claim it.",
)
_WAITING = Obstacle(
    stands=lambda seen, caller: seen["state"] == State.PENDING and seen["waiting"],
    conflict="Todo {id} is waiting to be retried until {next_retry_at}.",
)
_LEASE_HELD = Obstacle(
    stands=lambda seen, caller: seen["state"] == State.CLAIMED and not seen["lease_lapsed"],
    conflict="Todo {id} is claimed by {owner!r} until {lease_expires_at}.",
)
_KEY_HELD = Obstacle(
    stands=lambda seen, caller: seen["key_holder"] is not None,
    conflict=(
        "Todo {id} waits for its concurrency key {concurrency_key!r}, held by claimed todo "
        "{key_holder}."
    ),
)
_QUEUE_PAUSED = Obstacle(
    stands=lambda seen, caller: bool(seen["queue_paused"]),
    conflict="Todo {id}'s queue {queue!r} is paused; nothing of it is claimed until it resumes.",
)
_QUEUE_FULL = Obstacle(
    stands=lambda seen, caller: seen["queue_room"] == 0,
    conflict=("Todo {id}'s queue {queue!r} is at its rate or concurrency limit; try again later."),
)
_NO_ATTEMPT_LEFT = Obstacle(
    stands=lambda seen, caller: (
        seen["state"] == State.CLAIMED and seen["attempt"] >= seen["max_attempts"]
    ),
    conflict=(
        "Todo {id}'s lease lapsed on its last attempt ({attempt} of {max_attempts}); "
        "the reaper dead-letters it."
    ),
)
_KEY_TAKEN = Obstacle(
    stands=lambda seen, caller: seen["live_twin"] is not None,
    conflict=(
        "Todo {id} was not requeued: live todo {live_twin} holds idempotency key "
        "{idempotency_key!r} in queue {queue!r}."
    ),
    refusal="a live todo holds the same idempotency key",
)

_CLAIMED = frozenset({State.CLAIMED})


def _owner_guarded(name: str, method: str = "") -> Transition:
    """A transition of the lease's holder: the todo must be claimed, by the caller; a holder
    whose todo an operator cancelled is told so."""
    return Transition(
        name,
        _CLAIMED,
        wrong_state=NOT_CLAIMED,
        obstacles=(NOT_HELD,),
        ended_by=(CANCELLED,),
        method=method,
    )


TRANSITIONS: dict[str, Transition] = {
    transition.name: transition
    for transition in (
        Transition("create_todo", frozenset()),
        Transition("create_child", frozenset(), method="create_todo"),
        Transition("create_many", frozenset()),
        Transition("create_graph", frozenset(), method="create_many"),
        Transition("tick_schedule", frozenset()),
        Transition("claim_next", frozenset({State.PENDING, State.CLAIMED})),
        Transition(
            "claim_next_few", frozenset({State.PENDING, State.CLAIMED}), method="claim_next"
        ),
        Transition("claim_ready", frozenset({State.PENDING}), method="claim_next"),
        Transition("claim_ready_few", frozenset({State.PENDING}), method="claim_next"),
        Transition("claim_one", frozenset({State.PENDING}), method="claim_next"),
        Transition("claim_filtered", frozenset({State.PENDING, State.CLAIMED})),
        Transition(
            "claim",
            frozenset({State.PENDING, State.CLAIMED}),
            wrong_state="Todo {id} is {state}; only pending todos can be claimed.",
            obstacles=(
                _ASSIGNED_ELSEWHERE,
                _WAITING,
                _LEASE_HELD,
                _NO_ATTEMPT_LEFT,
                _QUEUE_PAUSED,
                _KEY_HELD,
                _QUEUE_FULL,
            ),
        ),
        Transition("await_todo", frozenset({State.PENDING, State.CLAIMED}), method="wait_for"),
        _owner_guarded("heartbeat"),
        _owner_guarded("heartbeat_many"),
        _owner_guarded("complete"),
        _owner_guarded("complete_leaf", method="complete"),
        _owner_guarded("complete_many"),
        _owner_guarded("fail"),
        _owner_guarded("fail_leaf", method="fail"),
        _owner_guarded("release"),
        Transition("reap_expired", _CLAIMED),
        Transition("repair_blocked", frozenset({State.PENDING})),
        Transition(
            "requeue",
            frozenset({State.FAILED}),
            wrong_state="Todo {id} is {state}; only failed (dead-lettered) todos can be requeued.",
            obstacles=(_KEY_TAKEN,),
            not_in_state="not dead-lettered",
            repair=Repair(
                permission="requeue_todo",
                permission_name="Can requeue dead-lettered todos",
                label=_("Requeue this dead letter"),
                explanation=_("Back to pending with its attempts reset; workers will run it again"),
                done="requeued",
            ),
        ),
        Transition(
            "expire_lease",
            _CLAIMED,
            wrong_state="Todo {id} is {state}; only claimed todos have a lease to expire.",
            not_in_state="not claimed",
            repair=Repair(
                permission="expire_lease_todo",
                permission_name="Can expire the lease of claimed todos",
                label=_("Expire its lease now"),
                explanation=_("The reaper or the next claim takes it back from its worker"),
                done="expired",
            ),
        ),
        Transition(
            "cancel",
            frozenset({State.PENDING, State.CLAIMED}),
            wrong_state="Todo {id} is {state}; only pending and claimed todos can be cancelled.",
            not_in_state="neither pending nor claimed",
            repair=Repair(
                permission="cancel_todo",
                permission_name="Can cancel pending and claimed todos",
                label=_("Cancel…"),
                explanation=_(
                    "Asks for a reason first; a dead letter then, and its worker stops at its "
                    "next heartbeat"
                ),
                done="cancelled",
            ),
        ),
        Transition(
            "set_priority",
            frozenset({State.PENDING}),
            wrong_state="Todo {id} is {state}; only pending todos can be given a priority.",
            not_in_state="not pending",
            repair=Repair(
                permission="set_priority_todo",
                permission_name="Can set the priority of pending todos",
                label=_("Set its priority…"),
                explanation=_("Asks for the new priority first; higher is claimed sooner"),
                done="reprioritised",
            ),
        ),
    )
}

#: The operator repairs by name, each with its transition, in the order the admin offers them.
REPAIRS = {name: (row, row.repair) for name, row in TRANSITIONS.items() if row.repair is not None}
#: Todo.Meta.permissions: one per operator repair.
PERMISSIONS = [(repair.permission, repair.permission_name) for _row, repair in REPAIRS.values()]
