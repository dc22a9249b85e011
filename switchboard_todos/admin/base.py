"""What every admin page here shares: nothing is edited through forms, and the typed generics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.http import HttpRequest

from switchboard_todos.models import Event, Todo

if TYPE_CHECKING:
    TodoModelAdmin = admin.ModelAdmin[Todo]
    EventModelAdmin = admin.ModelAdmin[Event]
    TodoInlineAdmin = admin.TabularInline[Todo, Event]
else:  # Django's classes take no type parameters at run time.
    TodoModelAdmin = EventModelAdmin = admin.ModelAdmin
    TodoInlineAdmin = admin.TabularInline

#: The JSON columns, left out of list pages: they can be large and the list never shows them.
JSON_COLUMNS = ("payload", "result", "errors")


class ReadOnly:
    """Nothing is added, edited or deleted through forms: changes are actions (or purging)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
