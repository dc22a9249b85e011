"""Which database the todo pages show, when queues live in several (placement.py).

`?database=ALIAS` on the list, the health page and a todo's page picks one; the list's filter
offers each database that holds todos, and a todo's page reads the list's preserved filters, so
its buttons repair the todo where it lives. Without the parameter: the router's database.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from django.contrib import admin
from django.db import router
from django.db.models import QuerySet
from django.http import Http404, HttpRequest
from django.utils.translation import gettext_lazy as _

from switchboard_todos import placement
from switchboard_todos.models import Todo

if TYPE_CHECKING:
    from django.contrib.admin.filters import _ListFilterChoices

PARAMETER = "database"


def chosen(request: HttpRequest) -> str:
    """The database the request asks for, checked to hold todos (else 404)."""
    alias = request.GET.get(PARAMETER)
    if alias is None:
        preserved = parse_qs(request.GET.get("_changelist_filters", ""))
        alias = preserved.get(PARAMETER, [None])[0]
    if alias is None:
        return router.db_for_read(Todo)
    if alias not in placement.todo_databases():
        raise Http404(f"No database {alias!r} holds todos.")
    return alias


def query(request: HttpRequest) -> str:
    """`database=ALIAS&` for links that stay in the chosen database, or "" for the default."""
    alias = chosen(request)
    return "" if alias == router.db_for_read(Todo) else f"{PARAMETER}={alias}&"


class DatabaseFilter(admin.SimpleListFilter):
    """The database to list; shown only when todos live in more than one."""

    title = _("database")
    parameter_name = PARAMETER

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        databases = placement.todo_databases()
        return [(alias, alias) for alias in databases] if len(databases) > 1 else []

    def choices(self, changelist: Any) -> Iterator[_ListFilterChoices]:
        """One choice per database, no "All": a list shows one database's todos."""
        current = chosen(self.request)
        for alias, label in self.lookup_choices:
            yield {
                "selected": alias == current,
                "query_string": changelist.get_query_string({PARAMETER: alias}),
                "display": label,
            }

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset  # the admin's get_queryset is on the chosen database already
