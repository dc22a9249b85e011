"""Todos built from a statement's rows: where each field is in rows of one shape, and the
instances made without Model.__init__ (a third of what `Model.from_db` costs)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

if TYPE_CHECKING:
    from switchboard_todos.models import Todo


#: The commonest JSON texts of a todo's columns (an empty payload, an empty list), made
#: without the parser: json.loads cost a claimed todo more than building its Todo.
EMPTY_JSON: Mapping[str, Callable[[], Any]] = MappingProxyType({"[]": list, "{}": dict})


#: Where a Todo read by `Todo.objects.with_errors()` keeps its failure history (Todo.errors).
HISTORY = "error_history"


class Layout(NamedTuple):
    """Where a Todo's values are in rows of one shape (see `TodoManager._layout`)."""

    attnames: list[str]
    pick: Callable[[Sequence[Any]], tuple[Any, ...]]
    json: list[tuple[int, models.JSONField[Any]]]
    extra: int | None
    id: int
    #: Where a todo's parents are: a todo that has some waits for others (Dependencies).
    parents: int
    #: The JSON texts read without parsing (EMPTY_JSON), unless a JSON field has a decoder.
    empty_json: Mapping[str, Callable[[], Any]]
    #: Where a create's row leaves out what its creator gave (CREATED_NULLS), by field name;
    given: list[tuple[int, str]]
    #: and what every new todo starts with (CREATED_FRESH), as the database would send it.
    fresh: list[tuple[int, Any]]


class NewLayout(NamedTuple):
    """How a todo create_many inserted is built from what it sent (`TodoManager._new_todos`):
    where each value goes (`layout`, whose `given` are filled from the creator's parameters),
    what every new todo starts with (`fresh`, each field's database default), and where the
    values the database decided go."""

    layout: Layout
    fresh: list[Any]
    max_attempts: int
    next_retry_at: int
    created_at: int
    updated_at: int
    fair_at: int


def instances(model: type[Todo], alias: str, attnames: list[str]) -> Callable[[list[Any]], Todo]:
    """How to build `model` instances of database `alias` from values of every concrete field.

    What `Model.from_db` builds, a third of its cost: the values go straight into the
    instance's `__dict__`, as `Model.__init__` would put them (a fresh instance has no related
    object cached for its foreign key's setter to clear). Only when nothing could tell: the
    model keeps Django's `__init__` and no pre_init or post_init receiver listens; else
    `from_db` itself.
    """
    if model.__init__ is not models.Model.__init__ or (
        # Any receiver at all, then whether one is this model's: the common case pays two tests.
        (pre_init.receivers or post_init.receivers)
        and any(signal.has_listeners(model) for signal in (pre_init, post_init))
    ):
        return functools.partial(model.from_db, alias, attnames)

    def build(values: list[Any]) -> Todo:
        instance = model.__new__(model)
        state = instance.__dict__["_state"] = ModelState()
        state.db, state.adding = alias, False
        instance.__dict__.update(zip(attnames, values, strict=True))
        return instance

    return build


def parsed(values: list[Any], layout: Layout, connection: BaseDatabaseWrapper) -> list[Any]:
    """`values` (of the fields of `layout`), their JSON texts parsed in place: Django's psycopg
    setup hands JSON columns over as text."""
    for index, field in layout.json:
        text = values[index]
        if text is not None:
            empty = layout.empty_json.get(text)  # an empty payload, say
            values[index] = (
                empty()
                if empty is not None
                else field.from_db_value(text, field.cached_col, connection)
            )
    return values


def fresh_value(field: models.Field[Any, Any]) -> Any:
    """What a new todo's row holds in `field` (CREATED_FRESH) as the database sends it: its
    db_default (JSON as text, parsed with the row's other JSON), else NULL."""
    default = field.db_default
    if default is models.NOT_PROVIDED:
        return None
    value = default.value if isinstance(default, models.Value) else default
    if isinstance(field, models.JSONField):
        return json.dumps(value)
    return value.value if isinstance(value, Enum) else value  # State.PENDING: "pending"
