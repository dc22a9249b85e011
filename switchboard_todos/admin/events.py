"""Inbound deliveries, read-only, each with the todos it made."""

from __future__ import annotations

import re

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from switchboard_todos.admin.base import (
    JSON_COLUMNS,
    EventModelAdmin,
    ReadOnly,
    RefusesNul,
    TodoInlineAdmin,
)
from switchboard_todos.admin.display import pretty_json
from switchboard_todos.admin.pagination import EstimatedCountPaginator
from switchboard_todos.models import Event, Todo

EVENT_ID = re.compile(r"ev_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class TodoInline(ReadOnly, TodoInlineAdmin):
    """The event's todos, read-only, each linking to its page."""

    model = Todo
    fk_name = "event"
    fields = readonly_fields = ("queue", "kind", "title", "state", "attempt", "created_at")
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = True
    ordering = ["created_at"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Todo]:
        return super().get_queryset(request).defer(*JSON_COLUMNS)


@admin.register(Event)
class EventAdmin(ReadOnly, RefusesNul, EventModelAdmin):
    """Inbound deliveries, read-only, with the todos each one made."""

    list_display = ["id", "source", "kind", "delivery_id", "received_at"]
    search_fields = ["=id"]
    search_help_text = _("An event id (ev_…) or a delivery id, matched exactly.")
    list_per_page = 100
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator
    fields = readonly_fields = (
        "id",
        "source",
        "kind",
        "delivery_id",
        "received_at",
        "payload_json",
    )
    inlines = [TodoInline]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Event], search_term: str
    ) -> tuple[QuerySet[Event], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if EVENT_ID.fullmatch(term):
            return queryset.filter(pk=term), False
        return queryset.filter(delivery_id=term), False

    @admin.display(description=_("payload"))
    def payload_json(self, event: Event) -> SafeString:
        return pretty_json(event.payload)
