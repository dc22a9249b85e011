"""Todos created together that wait for each other: `create_many` with `ref` and `after`.

A member of the batch may name itself with `ref`, and an entry of its `after` is the `ref` of
another member, or else the id of an existing todo. Planning a batch gives each member its id,
its parents as ids and how many of them are members (new, so not done yet); it refuses a ref
used twice, a todo waiting for itself and a cycle (InvalidPlan) before anything is written. An
entry of `after` that is no member's ref is taken as an id, which the create refuses if no todo
has it. docs/dependencies.md shows it from an agent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from switchboard_todos import validation
from switchboard_todos.exceptions import InvalidPlan, InvalidTodo

#: Longest `ref`, the name a member of a batch goes by in the others' `after`: an entry of
#: `after` is a ref or a todo id, checked as an id is (validation.parents).
REF_MAX_LENGTH = validation.TODO_ID_MAX_LENGTH


@dataclass(frozen=True)
class Graph:
    """The dependencies of a batch's members, by position, all as todo ids."""

    ids: list[str]
    parents: list[list[str]]
    members_waited: list[int]
    """How many of each member's parents are members of the batch."""
    existing: list[str]
    """The existing todos members wait for, each once, in id order (the order they lock in)."""


def split_refs(
    todos: Iterable[Mapping[str, Any]],
) -> tuple[list[Mapping[str, Any]], list[str | None]]:
    """The specs of a batch without their `ref`, and each one's ref (checked: text, unique)."""
    if isinstance(todos, str | bytes | Mapping) or not isinstance(todos, Iterable):
        raise InvalidTodo(f"todos must be a list of mappings, not {type(todos).__name__}.")
    specs = list(todos)
    if not any(isinstance(spec, Mapping) and "ref" in spec for spec in specs):
        return specs, [None] * len(specs)
    refs: list[str | None] = []
    stripped: list[Mapping[str, Any]] = []
    for number, spec in enumerate(specs):
        if not isinstance(spec, Mapping) or "ref" not in spec:
            refs.append(None)
            stripped.append(spec)
            continue
        try:
            ref = validation.text(spec["ref"], "ref", REF_MAX_LENGTH, required=True)
        except InvalidTodo as error:
            raise InvalidTodo(f"todo #{number}: {error}") from error
        if ref in refs:
            raise InvalidPlan(f"todo #{number}: ref {ref!r} names two todos of the batch.")
        refs.append(ref)
        stripped.append({name: value for name, value in spec.items() if name != "ref"})
    return stripped, refs


def plan(batch: list[dict[str, Any]], refs: list[str | None], ids: list[str]) -> Graph:
    """The graph of a validated batch whose members get `ids`; InvalidPlan for a todo waiting
    for itself or a cycle."""
    position = {ref: number for number, ref in enumerate(refs) if ref is not None}
    parents: list[list[str]] = []
    members: list[list[int]] = []
    existing: set[str] = set()
    for params in batch:
        named = params["parents"] or []
        inside = [position[name] for name in named if name in position]
        members.append(inside)
        parents.append([ids[position[name]] if name in position else name for name in named])
        existing.update(name for name in named if name not in position)
    for number, inside in enumerate(members):
        if number in inside:
            raise InvalidPlan(f"todo #{number} waits for itself.")
    _refuse_cycles(members, refs)
    return Graph(
        ids=ids,
        parents=parents,
        members_waited=[len(inside) for inside in members],
        existing=sorted(existing),
    )


def _refuse_cycles(members: list[list[int]], refs: list[str | None]) -> None:
    """Kahn's algorithm: members that never run out of waiting are on a cycle."""
    waiting = [len(inside) for inside in members]
    waited_by: list[list[int]] = [[] for _ in members]
    for number, inside in enumerate(members):
        for parent in inside:
            waited_by[parent].append(number)
    ready = [number for number, count in enumerate(waiting) if count == 0]
    while ready:
        for child in waited_by[ready.pop()]:
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    stuck = [number for number, count in enumerate(waiting) if count > 0]
    if stuck:
        names = ", ".join(refs[number] or f"#{number}" for number in stuck[:5])
        raise InvalidPlan(f"The batch's todos wait for each other in a cycle: {names}.")
