"""The todo list and detail pages: read-only, fast at millions of rows.

The list never counts the whole table, its filters' choices come from index skip scans or bounded
reads, and its searches use an index (see `Todo.Meta.indexes`). Changes are actions (actions.py).
"""

from __future__ import annotations

import re
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.admin.views.main import ChangeList
from django.db.models import BooleanField, ExpressionWrapper, F, Q, QuerySet
from django.db.models.functions import Left, Now
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.formats import localize
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from switchboard_todos import tracing
from switchboard_todos.admin import databases
from switchboard_todos.admin.actions import TodoActions
from switchboard_todos.admin.base import JSON_COLUMNS, ReadOnly, RefusesNul
from switchboard_todos.admin.colours import swatch
from switchboard_todos.admin.databases import DatabaseFilter
from switchboard_todos.admin.dates import AdminTodoQuerySet
from switchboard_todos.admin.display import (
    event_link,
    failure_table,
    json_text,
    pretty_json,
    progress_head,
)
from switchboard_todos.admin.filters import (
    AssigneeFilter,
    AttentionFilter,
    FairKeyFilter,
    KindFilter,
    PriorityFilter,
    QueueFilter,
)
from switchboard_todos.admin.graph import Dependencies, DependencyGraph, Relative, dependencies
from switchboard_todos.admin.health import HealthPage
from switchboard_todos.admin.pagination import EstimatedCountPaginator
from switchboard_todos.models import State, Todo

#: A todo id as the app and the Go service make them; searched by primary key alone.
TODO_ID = re.compile(r"td_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
#: Characters of a progress note the list shows.
PROGRESS_CHARS = 60
#: The ids of a todo's parents: its page reads them, the list does not.
GRAPH_COLUMNS = ("parents",)


class TodoChangeList(ChangeList):
    """The todo list, without the JSON columns and the parents' ids it does not show, and with
    the head of each progress note, cut in the database (display.json_text)."""

    def get_queryset(
        self, request: HttpRequest, exclude_parameters: list[str | None] | None = None
    ) -> QuerySet[Any]:
        todos: QuerySet[Any] = (
            super().get_queryset(request, exclude_parameters).defer(*JSON_COLUMNS, *GRAPH_COLUMNS)
        )
        note = json_text(F("progress"))
        listed: QuerySet[Any] = todos.annotate(progress_head=Left(note, PROGRESS_CHARS + 1))
        return listed


@admin.register(Todo)
class TodoAdmin(ReadOnly, RefusesNul, TodoActions, HealthPage):
    """Todos, read-only; requeue, expire-lease, cancel and set-priority as gated actions."""

    # Four columns, each wrapping, so that the list fits a laptop's width with the sidebar and
    # the filters open (1366 px, tests/test_admin_browser.py): what it is, where it stands, when,
    # and what its holder last said.
    list_display = ["todo", "state_column", "when", "progress_note"]
    list_filter = [
        DatabaseFilter,
        "state",
        AttentionFilter,
        PriorityFilter,
        QueueFilter,
        KindFilter,
        AssigneeFilter,
        FairKeyFilter,
    ]
    date_hierarchy = "created_at"
    search_fields = ["=id"]
    search_help_text = _(
        "A todo id (td_…), or an idempotency key or the owner of a claimed todo, matched "
        "exactly; anything else is looked for in titles, which reads every todo (slow)."
    )
    list_per_page = 100
    # Newest first, NULLS LAST: the order idx_todos_created and idx_todos_queue are built in.
    ordering = [F("created_at").desc(nulls_last=True)]
    show_full_result_count = False
    # Facets count every filter choice over the whole list on each page view.
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator
    actions = [
        "requeue_selected",
        "expire_lease_selected",
        "cancel_selected",
        "set_priority_selected",
    ]
    fieldsets = [
        (
            _("What"),
            {
                "fields": [
                    "id",
                    "queue",
                    "kind",
                    "title",
                    "source",
                    "event_link",
                    "idempotency_key",
                    "assignee",
                ]
            },
        ),
        (
            _("Lifecycle"),
            {
                "description": _(
                    "Pending until a worker claims it; a claim holds a lease until "
                    "“lease expires”, renewed by heartbeats. An expired lease is taken back by "
                    "the reaper or the next claim. A failed attempt backs off: “claimable” says "
                    "when it is retried (a todo created with run_after: when it is scheduled; "
                    "one waiting for other todos: blocked); after the last attempt the todo is "
                    "failed: a dead letter. Within a "
                    "priority, claims follow the turns, the fair keys (tenants) of a queue "
                    "taking turns."
                ),
                "fields": [
                    "state_explained",
                    "priority",
                    "fair_key",
                    "turn",
                    "owner",
                    "attempts",
                    "lease_expires_at",
                    "claimable",
                    "created_at",
                    "claimed_at",
                    "updated_at",
                    "completed_at",
                ],
            },
        ),
        (
            _("Input and outcome"),
            {
                "description": _(
                    "The progress note is the latest its holder reported with a heartbeat."
                ),
                "fields": ["payload_json", "progress_json", "result_json"],
            },
        ),
        (
            _("Failure history"),
            {
                "description": _(
                    "One row per failed or expired attempt, oldest first, as recorded by fail, "
                    "the reaper, a claim that took over an expired lease, or an operator's cancel."
                ),
                "fields": ["failure_history"],
            },
        ),
    ]

    class Media:
        css = {"all": ["switchboard_todos/admin.css"]}

    #: Shown on the page of a todo that has parents or children.
    dependencies_fieldset = (
        _("Dependencies"),
        {
            "description": _(
                "The todos this one waits for (it is claimable once each is done) and those "
                "that wait for it; the graph shows two levels each way, each todo a link."
            ),
            "fields": ["dependency_graph", "waits_for", "waited_for_by"],
        },
    )

    def get_fieldsets(self, request: HttpRequest, obj: Todo | None = None) -> Any:
        fieldsets: list[Any] = list(self.fieldsets or [])
        if obj is not None and tracing.trace_id(obj.trace_context) is not None:
            name, options = fieldsets[0]
            fieldsets[0] = (name, {**options, "fields": [*options["fields"], "trace_id"]})
        if obj is not None and _dependencies(obj) is not None:
            fieldsets.insert(2, self.dependencies_fieldset)
        return fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Todo | None = None) -> list[str]:
        return flatten_fieldsets(self.get_fieldsets(request, obj))

    # Queries

    def get_queryset(self, request: HttpRequest) -> QuerySet[Todo]:
        expired = ExpressionWrapper(Q(lease_expires_at__lte=Now()), output_field=BooleanField())
        waiting = ExpressionWrapper(Q(next_retry_at__gt=Now()), output_field=BooleanField())
        queryset = AdminTodoQuerySet(Todo, using=databases.chosen(request))
        queryset = queryset.annotate(lease_expired=expired, waiting=waiting)
        return queryset.order_by(*self.get_ordering(request))

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return TodoChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Todo], search_term: str
    ) -> tuple[QuerySet[Todo], bool]:
        """Exact, indexed matches first (id, key, owner); titles only when those find nothing."""
        term = search_term.strip()
        if not term:
            return queryset, False
        if TODO_ID.fullmatch(term):
            return queryset.filter(pk=term), False
        exact = queryset.filter(Q(idempotency_key=term) | Q(state=State.CLAIMED, owner=term))
        if " " not in term and exact.exists():
            return exact, False
        for word in term.split():
            queryset = queryset.filter(title__icontains=word)
        return queryset, False

    # List columns

    @admin.display(description=_("todo"))
    def todo(self, todo: Todo) -> SafeString:
        """Its title (else its kind), then its id's first hex digits (the full id the tooltip),
        queue and kind, on a second line."""
        shown = todo.title or todo.kind or todo.id
        about = [todo.queue, *([todo.kind] if todo.kind and todo.kind != shown else [])]
        return format_html(
            '{}<br><span class="switchboard-about"><span title="{}">{}…</span> · {}</span>',
            Truncator(shown).chars(80),
            todo.id,
            todo.id[:11],
            " · ".join(about),
        )

    @admin.display(description=_("state"))
    def state_column(self, todo: Todo) -> SafeString:
        """Its state in its colour (colours.py), its attempt, and who holds it or last did."""
        holder = format_html("<br>{}", todo.owner) if todo.owner else ""
        return format_html(
            '{} {}<br><span class="switchboard-about">{}</span>{}',
            swatch(_status(todo)),
            State(todo.state).label,
            _("attempt %(attempts)s") % {"attempts": self.attempts(todo)},
            holder,
        )

    @admin.display(description=_("attempt"))
    def attempts(self, todo: Todo) -> str:
        return f"{todo.attempt} of {todo.max_attempts}"

    @admin.display(description=_("lease or next run / created"), ordering="created_at")
    def when(self, todo: Todo) -> SafeString:
        """When its lease ends or when it may run (`_claimable`), then when it was created."""
        created = format_html(
            '<span class="switchboard-about">{} {}</span>',
            _("created"),
            localize(timezone.localtime(todo.created_at)) if todo.created_at else "—",
        )
        if todo.state == State.CLAIMED and todo.lease_expires_at is not None:
            until = localize(timezone.localtime(todo.lease_expires_at))
            if getattr(todo, "lease_expired", False):
                lease = format_html("<strong>{}</strong> {}", _("expired"), until)
            else:
                lease = format_html("{} {}", _("lease until"), until)
            return format_html("{}<br>{}", lease, created)
        claimable = _claimable(todo)
        return format_html("{}<br>{}", claimable, created) if claimable else created

    @admin.display(description=_("progress"))
    def progress_note(self, todo: Todo) -> str:
        return progress_head(getattr(todo, "progress_head", None), PROGRESS_CHARS)

    # Detail fields

    @admin.display(description=_("event"))
    def event_link(self, todo: Todo) -> SafeString | str:
        return event_link(todo.event_id)

    @admin.display(description=_("state"))
    def state_explained(self, todo: Todo) -> str:
        meaning = {
            State.PENDING: _("waiting for a worker to claim it"),
            State.CLAIMED: _("a worker holds it under a lease"),
            State.DONE: _("completed; the result is below"),
            State.FAILED: _(
                "dead letter: it failed its last attempt or was cancelled. An operator who may "
                "requeue it does so with the button “Requeue this dead letter” at the top of "
                "this page."
            ),
        }[State(todo.state)]
        if todo.blocked:
            meaning = _("blocked: claimable once the todos it waits for (below) are done")
        return f"{State(todo.state).label} — {meaning}"

    @admin.display(description=_("claimable"))
    def claimable(self, todo: Todo) -> str:
        """When a pending todo may be claimed: now, at a time (scheduled, or a retry after a
        failed attempt), or once its parents are done (blocked)."""
        if todo.state != State.PENDING:
            return "—"
        return _claimable(todo) or str(_("now"))

    @admin.display(description=_("trace id"))
    def trace_id(self, todo: Todo) -> str:
        """The trace its creator's span was in (tracing.py): its spans, and those of its
        claims, handler runs and settlements, are found under it in the tracing backend."""
        return tracing.trace_id(todo.trace_context) or "—"

    @admin.display(description=_("turn"))
    def turn(self, todo: Todo) -> str:
        """Its place among its queue's todos of its priority (fair_at): claims go in turn order."""
        return str(localize(timezone.localtime(todo.fair_at)))

    @admin.display(description=_("payload"))
    def payload_json(self, todo: Todo) -> SafeString:
        return pretty_json(todo.payload)

    @admin.display(description=_("progress note"))
    def progress_json(self, todo: Todo) -> SafeString:
        return pretty_json(todo.progress)

    @admin.display(description=_("result (or the last error)"))
    def result_json(self, todo: Todo) -> SafeString:
        return pretty_json(todo.result)

    @admin.display(description=_("failed attempts"))
    def failure_history(self, todo: Todo) -> SafeString | str:
        return failure_table(todo.errors, todo.errors_dropped)

    @admin.display(description=_("graph"))
    def dependency_graph(self, todo: Todo) -> SafeString | str:
        found = _dependencies(todo)
        if found is None:
            return "—"
        context = {"graph": DependencyGraph(found), "label": _("The todos around %s") % todo.id}
        return render_to_string("admin/switchboard_todos/todo/dependency_graph.html", context)

    @admin.display(description=_("waits for"))
    def waits_for(self, todo: Todo) -> SafeString | str:
        found = _dependencies(todo)
        if found is None or not found.parents:
            return str(_("Nothing: it waits for no todo."))
        rows = [
            _row(found, parent, parent.result_head if parent.state == State.DONE else None)
            for parent in found.parents
        ]
        return _relatives_table(_("result"), rows, found.more_parents)

    @admin.display(description=_("waited for by"))
    def waited_for_by(self, todo: Todo) -> SafeString | str:
        found = _dependencies(todo)
        if found is None or not found.children:
            return str(_("No todo waits for it."))
        rows = [_row(found, child, _waiting(child)) for child in found.children]
        return _relatives_table(_("still waiting for"), rows, found.more_children)

    # Extra pages

    def get_urls(self) -> list[URLPattern]:
        app, model = self.opts.app_label, self.opts.model_name
        return [
            path(
                "health/",
                self.admin_site.admin_view(self.health_view),
                name=f"{app}_{model}_health",
            ),
            path(
                "requeue-dead-letters/",
                self.admin_site.admin_view(self.requeue_all_view),
                name=f"{app}_{model}_requeue_all",
            ),
            *super().get_urls(),
        ]


def _dependencies(todo: Todo) -> Dependencies | None:
    """graph.dependencies of the todo, read once for the page's three fields that show them."""
    if "_dependencies" not in todo.__dict__:
        todo.__dict__["_dependencies"] = dependencies(todo)
    found: Dependencies | None = todo.__dict__["_dependencies"]
    return found


def _status(todo: Todo) -> str:
    """What the todo is now, by the names of colours.COLOURS."""
    if todo.state == State.CLAIMED:
        return "lease_expired" if getattr(todo, "lease_expired", False) else "claimed"
    if todo.state == State.PENDING:
        if todo.blocked:
            return "blocked"
        return "waiting" if getattr(todo, "waiting", False) else "ready"
    return str(todo.state)


def _claimable(todo: Todo) -> str:
    """When a pending todo becomes claimable, by what holds it back: its parents (blocked), a
    failed attempt's backoff (retry), or a time it was given (scheduled: run_after, a delayed
    release). A time passed (a parent just done, a backoff over) is "available since"; ""
    for a todo ready since its creation, or not pending."""
    if todo.state != State.PENDING:
        return ""
    if todo.blocked:
        return _blocked(todo)
    if todo.next_retry_at is None:
        return ""
    at = localize(timezone.localtime(todo.next_retry_at))
    if not getattr(todo, "waiting", True):
        return _("available since %(at)s") % {"at": at}
    if todo.errors_bytes or todo.errors_dropped:
        return _("retry at %(at)s") % {"at": at}
    return _("scheduled for %(at)s") % {"at": at}


def _blocked(todo: Todo) -> str:
    return ngettext(
        "blocked: waits for %(count)d todo",
        "blocked: waits for %(count)d todos",
        todo.waiting_for,
    ) % {"count": todo.waiting_for}


def _waiting(relative: Relative) -> str:
    """How many todos a child still waits for; nothing once it no longer waits."""
    if relative.status != "blocked":
        return ""
    return ngettext("%(count)d todo", "%(count)d todos", relative.waiting_for) % {
        "count": relative.waiting_for
    }


def _row(found: Dependencies, relative: Relative, last: str | None) -> tuple[str, ...]:
    """A parent's or child's row: its page, id, kind or title, state, and `last`."""
    label = Truncator(relative.label).chars(80)
    return (relative.url(found.alias), relative.id, label, relative.status_label, last or "")


def _relatives_table(last: Any, rows: list[tuple[str, ...]], more: int) -> SafeString:
    """Parents or children as a table (`_row`), `last` the heading of the last column."""
    header = format_html_join(
        "", "<th scope='col'>{}</th>", [(c,) for c in (_("id"), _("todo"), _("state"), last)]
    )
    body = format_html_join(
        "", '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td></tr>', rows
    )
    caption = (
        format_html("<caption>{}</caption>", _("and %(count)d more, not listed") % {"count": more})
        if more > 0
        else ""
    )
    return format_html(
        '<table class="switchboard-relatives">{}<thead><tr>{}</tr></thead><tbody>{}</tbody>'
        "</table>",
        caption,
        header,
        body,
    )
