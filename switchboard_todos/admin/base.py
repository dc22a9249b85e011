"""What every admin page here shares: nothing edited through forms, NUL refused, typed generics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import BadRequest
from django.http import Http404, HttpRequest

from switchboard_todos.models import Event, Todo

if TYPE_CHECKING:
    TodoModelAdmin = admin.ModelAdmin[Todo]
    EventModelAdmin = admin.ModelAdmin[Event]
    TodoInlineAdmin = admin.TabularInline[Todo, Event]
    AnyModelAdmin = admin.ModelAdmin[Any]
else:  # Django's classes take no type parameters at run time.
    TodoModelAdmin = EventModelAdmin = admin.ModelAdmin
    TodoInlineAdmin = admin.TabularInline
    AnyModelAdmin = object

#: The JSON columns, left out of list pages: they can be large and the list never shows them
#: whole (of a progress note, the todo list reads only its head: todos.py). The failure
#: history is in its own table (ErrorEntry), read by a todo's page alone.
JSON_COLUMNS = ("payload", "result", "progress")


class ReadOnly:
    """Nothing is added, edited or deleted through forms: changes are actions (or purging)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class RefusesNul(AnyModelAdmin):
    """A NUL (0x00) in a URL is the client's error, not the server's.

    PostgreSQL text cannot hold NUL, so a query with one fails with a DataError (a 500). No todo or
    event has one: an id with NUL is not found (404), a filter, search or pick with one is a bad
    request (400), answered before any query.
    """

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Any:
        if "\x00" in object_id:
            raise Http404("No such id: it holds a NUL character.")
        return super().get_object(request, object_id, from_field)

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        for key, values in (*request.GET.lists(), *request.POST.lists()):
            if any("\x00" in text for text in (key, *values)):
                raise BadRequest(f"The parameter {key!r} holds a NUL character.")
        return super().get_changelist_instance(request)
