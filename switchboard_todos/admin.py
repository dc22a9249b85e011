"""The operator's admin: todos and events to look at, and permission-gated repairs.

Nothing is edited through forms. Every change of state is an action that calls the manager's
guarded transitions (in batches, so "all that match the filter" works at any size), writes one
LogEntry per todo it changed, and tells the operator what it changed and what it refused, and why.
The list stays fast at millions of rows: no full COUNT(*), filters whose choices come from index
skip scans or bounded reads, and searches that use an index (see `Todo.Meta.indexes`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import flatten_fieldsets, quote
from django.contrib.admin.views.main import ChangeList
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import BooleanField, ExpressionWrapper, F, Max, Min, Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.formats import localize
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from switchboard_todos import stats
from switchboard_todos.bulk import BATCH_SIZE, BulkOutcome, apply_in_batches
from switchboard_todos.managers import BatchResult
from switchboard_todos.models import Event, State, Todo
from switchboard_todos.validation import REASON_MAX_LENGTH

if TYPE_CHECKING:
    _Paginator = Paginator[Any]
    _TodoAdmin = admin.ModelAdmin[Todo]
    _EventAdmin = admin.ModelAdmin[Event]
    _TodoInline = admin.TabularInline[Todo, Event]
else:  # Django's classes take no type parameters at run time.
    _Paginator = Paginator
    _TodoAdmin = _EventAdmin = admin.ModelAdmin
    _TodoInline = admin.TabularInline

#: A todo id as the app and the Go service make them; searched by primary key alone.
TODO_ID = re.compile(r"td_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
EVENT_ID = re.compile(r"ev_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
#: The JSON columns, left out of list pages: they can be large and the list never shows them.
JSON_COLUMNS = ("payload", "result", "errors")
#: Ids named in a refusal message, per reason; the rest are counted.
IDS_SHOWN = 5


# Counting without COUNT(*) over the table


class EstimatedCountPaginator(_Paginator):
    """Count exactly up to `exact_limit` matches; past that, take PostgreSQL's estimate.

    An exact count of a million rows reads a million rows on every page view. The unfiltered
    count comes from pg_class.reltuples (kept by autovacuum); a filtered one is counted with a
    LIMIT, so it stops after `exact_limit` + 1 rows, and beyond that the planner's estimate is
    shown as "about N".
    """

    exact_limit = 10_000
    count_is_estimate = False

    @cached_property
    def count(self) -> int:
        queryset = cast("QuerySet[Any]", self.object_list).order_by()
        if not queryset.query.has_filters():
            estimate = _table_estimate(queryset)
            if estimate > self.exact_limit:
                self.count_is_estimate = True
                return estimate
        capped = queryset[: self.exact_limit + 1].count()
        if capped <= self.exact_limit:
            return capped
        self.count_is_estimate = True
        return max(_plan_estimate(queryset), capped)


def _table_estimate(queryset: QuerySet[Any]) -> int:
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
            [queryset.model._meta.db_table],
        )
        row = cursor.fetchone()
    return int(row[0]) if row else -1


def _plan_estimate(queryset: QuerySet[Any]) -> int:
    sql, params = queryset.query.sql_with_params()
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    return int(plan[0]["Plan"]["Plan Rows"])


def capped_count(queryset: QuerySet[Any], limit: int = EstimatedCountPaginator.exact_limit) -> str:
    """Count up to `limit` rows and say so: "12", or "more than 10,000"."""
    count = queryset.order_by()[: limit + 1].count()
    return localize(count) if count <= limit else f"more than {localize(limit)}"


# The list's queryset


class AdminTodoQuerySet(QuerySet[Todo]):
    """The admin's todos; `datetimes` answers the date hierarchy without reading every row."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._spans: dict[str, dict[str, Any]] = {}

    def aggregate(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Aggregate, keeping a field's first/last: the date hierarchy asks for it, then
        `datetimes` needs it, and under a filter no index serves (a title search) it costs a
        read of the table."""
        result = super().aggregate(*args, **kwargs)
        first, last = kwargs.get("first"), kwargs.get("last")
        if not args and isinstance(first, Min) and isinstance(last, Max) and len(kwargs) == 2:
            field = _aggregated_field(first)
            if field is not None and field == _aggregated_field(last):
                self._spans[field] = result
        return result

    def datetimes(
        self,
        field_name: str,
        kind: Literal["year", "month", "week", "day", "hour", "minute", "second"],
        order: Literal["ASC", "DESC"] = "ASC",
        tzinfo: tzinfo | None = None,
    ) -> QuerySet[Todo, datetime]:
        """The years, months or days that hold a todo, with one index probe per candidate.

        Django's version is a SELECT DISTINCT over every row in range: all million of them when
        the todos span one month. Here the candidates come from the first and last date (two
        index probes), each is probed for one row, and the DISTINCT runs over those few rows.
        """
        if kind not in ("year", "month", "day"):
            return super().datetimes(field_name, kind, order, tzinfo)
        zone = tzinfo or timezone.get_current_timezone()
        span = self._spans.get(field_name) or self.aggregate(
            first=Min(field_name), last=Max(field_name)
        )
        if span["first"] is None:
            return QuerySet.datetimes(self.none(), field_name, kind, order, tzinfo)
        bounds = _calendar_bounds(span["first"], span["last"], kind, zone)
        inner, params = self.order_by().values_list("pk", field_name).query.sql_with_params()
        with connections[self.db].cursor() as cursor:
            cursor.execute(
                "SELECT (SELECT found.pk FROM ("
                + inner
                + ") AS found (pk, at) WHERE found.at >= b.start AND found.at < b.stop LIMIT 1)"
                " FROM unnest(%s::timestamptz[], %s::timestamptz[]) AS b (start, stop)",
                (*params, bounds[:-1], bounds[1:]),
            )
            firsts = [pk for (pk,) in cursor.fetchall() if pk is not None]
        return (
            Todo.objects.using(self.db)
            .filter(pk__in=firsts)
            .datetimes(field_name, kind, order, tzinfo)
        )


def _aggregated_field(aggregate: Min | Max) -> str | None:
    name = getattr(aggregate.get_source_expressions()[0], "name", None)
    return name if isinstance(name, str) else None


def _calendar_bounds(first: datetime, last: datetime, kind: str, zone: tzinfo) -> list[datetime]:
    """The starts of the years, months or days from `first` to `last`, then the end of the last."""
    local = timezone.localtime(first, zone)
    year, month, day = local.year, (local.month if kind != "year" else 1), local.day
    if kind != "day":
        day = 1
    current = datetime(year, month, day, tzinfo=zone)
    bounds = [current]
    while current <= last:
        if kind == "year":
            current = datetime(current.year + 1, 1, 1, tzinfo=zone)
        elif kind == "month":
            carry, month_index = divmod(current.month, 12)
            current = datetime(current.year + carry, month_index + 1, 1, tzinfo=zone)
        else:
            following = current.date() + timedelta(days=1)
            current = datetime(following.year, following.month, following.day, tzinfo=zone)
        bounds.append(current)
    return bounds


class TodoChangeList(ChangeList):
    """The todo list, without the JSON columns it does not show."""

    def get_queryset(
        self, request: HttpRequest, exclude_parameters: list[str | None] | None = None
    ) -> QuerySet[Any]:
        return super().get_queryset(request, exclude_parameters).defer(*JSON_COLUMNS)


# Filters


class AttentionFilter(admin.SimpleListFilter):
    """The situations an operator looks for, each served by a partial index."""

    title = _("needs attention")
    parameter_name = "attention"
    conditions = {
        "dead": (_("Dead-lettered"), Q(state=State.FAILED)),
        "lease_expired": (
            _("Lease expired, not yet reaped"),
            Q(state=State.CLAIMED, lease_expires_at__lte=Now()),
        ),
        "waiting": (_("Waiting for retry"), Q(state=State.PENDING, next_retry_at__gt=Now())),
        "ready": (
            _("Ready to claim"),
            Q(state=State.PENDING) & (Q(next_retry_at__isnull=True) | Q(next_retry_at__lte=Now())),
        ),
    }

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [(key, label) for key, (label, _condition) in self.conditions.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        chosen = self.conditions.get(self.value() or "")
        return queryset if chosen is None else queryset.filter(chosen[1])


class ValuesFilter(admin.SimpleListFilter):
    """An exact-match filter whose choices are read cheaply (`values`), plus the chosen one."""

    def values(self) -> list[str]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        found = self.values()
        chosen = self.value()
        if chosen and chosen not in found:
            found.append(chosen)
        return [(value, value) for value in found]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        chosen = self.value()
        return queryset if chosen is None else queryset.filter(**{str(self.parameter_name): chosen})


class QueueFilter(ValuesFilter):
    title = _("queue")
    parameter_name = "queue"

    def values(self) -> list[str]:
        return stats.distinct_values("queue")


class KindFilter(ValuesFilter):
    title = _("kind (among the newest 10,000 todos)")
    parameter_name = "kind"

    def values(self) -> list[str]:
        return stats.recent_kinds()


class AssigneeFilter(ValuesFilter):
    title = _("assignee")
    parameter_name = "assignee"
    UNASSIGNED = "-"

    def values(self) -> list[str]:
        return stats.distinct_values("assignee")

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            (self.UNASSIGNED, str(_("Anyone (unassigned)"))),
            *super().lookups(request, model_admin),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == self.UNASSIGNED:
            return queryset.filter(assignee__isnull=True)
        return super().queryset(request, queryset)


# Actions


@dataclass(frozen=True)
class Operation:
    """An operator action: the batch transition it runs and how it reports and logs."""

    needs: State
    """The state the operation applies to; with "select all", only those todos are walked."""
    done: str
    """Past tense, for the counts: "requeued"."""
    run: Callable[[list[str]], BatchResult]
    log: Callable[[Todo], str]
    """The LogEntry message for one changed todo."""


def _requeue_operation() -> Operation:
    return Operation(
        needs=State.FAILED,
        done="requeued",
        run=Todo.objects.requeue_many,
        log=lambda todo: "Requeued: dead letter back to pending, attempts reset.",
    )


def _expire_operation() -> Operation:
    return Operation(
        needs=State.CLAIMED,
        done="expired",
        run=Todo.objects.expire_lease_many,
        log=lambda todo: (
            f"Expired the lease held by {todo.owner} "
            f"(attempt {todo.attempt} of {todo.max_attempts})."
        ),
    )


def _dead_letter_operation(reason: str) -> Operation:
    return Operation(
        needs=State.PENDING,
        done="dead-lettered",
        run=lambda ids: Todo.objects.dead_letter_many(ids, reason),
        log=lambda todo: f"Dead-lettered (cancelled) while pending: {reason}",
    )


class DeadLetterForm(forms.Form):
    reason = forms.CharField(
        label=_("Reason"),
        max_length=REASON_MAX_LENGTH,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text=_(
            "Why these todos are cancelled. Kept in each todo's result and failure history."
        ),
    )


# Todo admin


class ReadOnly:
    """Nothing is added, edited or deleted through forms: changes are actions (or purging)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class EventLink:
    """Render a link to an event's admin page from its id, without loading the event."""

    @staticmethod
    def html(event_id: str | None) -> SafeString | str:
        if event_id is None:
            return "—"
        # The admin escapes "_" (and more) in ids in its URLs: "ev_40…" unescaped would be "ev@…".
        url = reverse("admin:switchboard_todos_event_change", args=[quote(event_id)])
        return format_html('<a href="{}">{}</a>', url, event_id)


def _pretty_json(value: Any) -> SafeString:
    if value is None:
        return format_html("<p>{}</p>", "—")
    return format_html(
        '<pre class="switchboard-json">{}</pre>',
        json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True),
    )


def _when(value: Any) -> str:
    """A timestamp from the failure history (ISO text in the JSON), in the admin's zone."""
    moment = parse_datetime(value) if isinstance(value, str) else None
    if moment is None:
        return "—" if value is None else str(value)
    return str(localize(timezone.localtime(moment)))


@admin.register(Todo)
class TodoAdmin(ReadOnly, _TodoAdmin):
    """Todos, read-only; requeue, expire-lease and dead-letter as gated actions."""

    list_display = [
        "short_id",
        "queue",
        "kind",
        "short_title",
        "state",
        "owner",
        "attempts",
        "lease_or_retry",
        "created_at",
    ]
    list_filter = ["state", AttentionFilter, QueueFilter, KindFilter, AssigneeFilter]
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
    actions = ["requeue_selected", "expire_lease_selected", "dead_letter_selected"]
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
                    "“lease expires”, renewed by heartbeats. A lapsed lease is taken back by "
                    "the reaper or the next claim. A failed attempt waits until “next retry”; "
                    "after the last attempt the todo is failed: a dead letter."
                ),
                "fields": [
                    "state_explained",
                    "owner",
                    "attempts",
                    "lease_expires_at",
                    "next_retry_at",
                    "created_at",
                    "claimed_at",
                    "updated_at",
                    "completed_at",
                ],
            },
        ),
        (_("Input and outcome"), {"fields": ["payload_json", "result_json"]}),
        (
            _("Failure history"),
            {
                "description": _(
                    "One row per failed or lapsed attempt, oldest first, as recorded by fail, "
                    "the reaper, a claim that took over a lapsed lease, or an operator's cancel."
                ),
                "fields": ["failure_history"],
            },
        ),
    ]

    class Media:
        css = {"all": ["switchboard_todos/admin.css"]}

    #: No new batch starts after this many seconds of one action; the message says what is left.
    action_time_limit = 20.0
    #: Todos per guarded statement (and per LogEntry insert) when an action runs.
    action_batch_size = BATCH_SIZE

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return self._has_todo_permission(request, "requeue_todo")

    def has_expire_lease_permission(self, request: HttpRequest) -> bool:
        return self._has_todo_permission(request, "expire_lease_todo")

    def has_dead_letter_permission(self, request: HttpRequest) -> bool:
        return self._has_todo_permission(request, "dead_letter_todo")

    def _has_todo_permission(self, request: HttpRequest, codename: str) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    def get_readonly_fields(self, request: HttpRequest, obj: Todo | None = None) -> list[str]:
        return flatten_fieldsets(self.fieldsets or [])

    # Queries

    def get_queryset(self, request: HttpRequest) -> QuerySet[Todo]:
        lapsed = ExpressionWrapper(Q(lease_expires_at__lte=Now()), output_field=BooleanField())
        queryset = AdminTodoQuerySet(Todo, using=Todo.objects.db).annotate(lease_lapsed=lapsed)
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

    @admin.display(description=_("id"), ordering="id")
    def short_id(self, todo: Todo) -> SafeString:
        """The id's first hex digits, enough to tell todos apart; the full id is the tooltip."""
        return format_html('<span title="{}">{}…</span>', todo.id, todo.id[:11])

    @admin.display(description=_("title"), ordering="title")
    def short_title(self, todo: Todo) -> str:
        return Truncator(todo.title).chars(80)

    @admin.display(description=_("attempt"))
    def attempts(self, todo: Todo) -> str:
        return f"{todo.attempt} of {todo.max_attempts}"

    @admin.display(description=_("lease expires / next retry"))
    def lease_or_retry(self, todo: Todo) -> SafeString | str:
        if todo.state == State.CLAIMED and todo.lease_expires_at is not None:
            if getattr(todo, "lease_lapsed", False):
                return format_html(
                    "<strong>{}</strong> {}",
                    _("expired"),
                    localize(timezone.localtime(todo.lease_expires_at)),
                )
            return format_html(
                "{} {}", _("lease until"), localize(timezone.localtime(todo.lease_expires_at))
            )
        if todo.state == State.PENDING and todo.next_retry_at is not None:
            return format_html(
                "{} {}", _("retry at"), localize(timezone.localtime(todo.next_retry_at))
            )
        return "—"

    # Detail fields

    @admin.display(description=_("event"))
    def event_link(self, todo: Todo) -> SafeString | str:
        return EventLink.html(todo.event_id)

    @admin.display(description=_("state"))
    def state_explained(self, todo: Todo) -> str:
        meaning = {
            State.PENDING: _("waiting for a worker to claim it"),
            State.CLAIMED: _("a worker holds it under a lease"),
            State.DONE: _("completed; the result is below"),
            State.FAILED: _(
                "dead letter: it failed its last attempt or was cancelled. An operator can "
                "requeue it from the list (action “Requeue selected dead letters”)."
            ),
        }[State(todo.state)]
        return f"{State(todo.state).label} — {meaning}"

    @admin.display(description=_("payload"))
    def payload_json(self, todo: Todo) -> SafeString:
        return _pretty_json(todo.payload)

    @admin.display(description=_("result (or the last error)"))
    def result_json(self, todo: Todo) -> SafeString:
        return _pretty_json(todo.result)

    @admin.display(description=_("failed attempts"))
    def failure_history(self, todo: Todo) -> SafeString | str:
        entries = [entry for entry in todo.errors or [] if isinstance(entry, dict)]
        if not entries:
            return str(_("No failed attempts."))
        rows = []
        for entry in entries:
            recorded = entry.get("error")
            error: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
            extra = {k: v for k, v in error.items() if k not in ("type", "message", "traceback")}
            details = (
                format_html(
                    "<details><summary>{}</summary><pre>{}</pre></details>",
                    _("traceback"),
                    error["traceback"],
                )
                if error.get("traceback")
                else ""
            )
            if extra:
                details += _pretty_json(extra)
            rows.append(
                (
                    entry.get("attempt", "—"),
                    entry.get("owner") or "—",
                    _when(entry.get("claimed_at")),
                    _when(entry.get("at")),
                    error.get("type") or "—",
                    error.get("message") or "",
                    details,
                )
            )
        header = format_html_join(
            "",
            "<th scope='col'>{}</th>",
            [
                (label,)
                for label in (
                    _("attempt"),
                    _("owner"),
                    _("claimed at"),
                    _("failed at"),
                    _("error type"),
                    _("message"),
                    _("details"),
                )
            ],
        )
        body = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            rows,
        )
        return format_html(
            '<table class="switchboard-failures"><thead><tr>{}</tr></thead>'
            "<tbody>{}</tbody></table>",
            header,
            body,
        )

    # Actions

    @admin.action(
        permissions=["requeue"],
        description=_("Requeue selected dead letters (back to pending, attempts reset)"),
    )
    def requeue_selected(self, request: HttpRequest, queryset: QuerySet[Todo]) -> None:
        self.run_operation(request, queryset, _requeue_operation())

    @admin.action(
        permissions=["expire_lease"],
        description=_("Expire the lease of selected claimed todos (they come back now)"),
    )
    def expire_lease_selected(self, request: HttpRequest, queryset: QuerySet[Todo]) -> None:
        self.run_operation(request, queryset, _expire_operation())

    @admin.action(
        permissions=["dead_letter"],
        description=_("Dead-letter (cancel) selected pending todos…"),
    )
    def dead_letter_selected(
        self, request: HttpRequest, queryset: QuerySet[Todo]
    ) -> TemplateResponse | None:
        form = DeadLetterForm(request.POST if "post" in request.POST else None)
        if form.is_valid():
            self.run_operation(
                request, queryset, _dead_letter_operation(form.cleaned_data["reason"])
            )
            return None
        pending = queryset.filter(state=State.PENDING)
        context = {
            **self.admin_site.each_context(request),
            "title": _("Dead-letter (cancel) todos"),
            "opts": self.opts,
            "back": request.get_full_path(),
            "form": form,
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
            "pending_count": capped_count(pending),
            "other_count": capped_count(queryset.exclude(state=State.PENDING)),
            "shown": list(pending.defer(*JSON_COLUMNS)[:100]),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(
            request, "admin/switchboard_todos/todo/dead_letter_confirmation.html", context
        )

    def run_operation(
        self, request: HttpRequest, queryset: QuerySet[Todo], operation: Operation
    ) -> BulkOutcome:
        """Apply `operation` to `queryset` in batches; log each change; report counts and refusals.

        Picked rows all go to the operation, which says why it refused each one. With "select
        all" (possibly millions), only the todos in the state the operation needs are walked.
        """
        if request.POST.get("select_across") == "1":
            queryset = queryset.filter(state=operation.needs)
        content_type = ContentType.objects.get_for_model(Todo, for_concrete_model=False)
        user_id = cast(int, request.user.pk)

        def log(result: BatchResult) -> None:
            LogEntry.objects.bulk_create(
                [
                    LogEntry(
                        user_id=user_id,
                        content_type_id=content_type.pk,
                        object_id=todo.pk,
                        object_repr=str(todo)[:200],
                        action_flag=CHANGE,
                        change_message=operation.log(todo),
                    )
                    for todo in result.changed
                ]
            )

        outcome = apply_in_batches(
            queryset,
            operation.run,
            batch_size=self.action_batch_size,
            time_limit=self.action_time_limit,
            on_batch=log,
        )
        self.report(request, outcome, operation.done)
        return outcome

    def report(self, request: HttpRequest, outcome: BulkOutcome, done: str) -> None:
        """Tell the operator the counts, each reason for a refusal, and whether todos are left."""
        if outcome.changed:
            message = ngettext(
                "%(count)s todo %(done)s.", "%(count)s todos %(done)s.", outcome.changed
            )
            self.message_user(
                request,
                message % {"count": localize(outcome.changed), "done": done},
                messages.SUCCESS,
            )
        elif not outcome.refused:
            self.message_user(request, f"No todos {done}: none matched.", messages.WARNING)
        for reason, ids in sorted(outcome.refused.items()):
            listed = ", ".join(ids[:IDS_SHOWN])
            if len(ids) > IDS_SHOWN:
                listed += f" and {localize(len(ids) - IDS_SHOWN)} more"
            self.message_user(
                request, f"{localize(len(ids))} not {done}: {reason} ({listed}).", messages.WARNING
            )
        if outcome.unfinished:
            self.message_user(
                request,
                f"Stopped after {self.action_time_limit:g} seconds with todos left: run it again "
                "to go on, or use manage.py requeue_todos for very large sets.",
                messages.WARNING,
            )

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

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return super().changelist_view(
            request, {**self._permissions(request), **(extra_context or {})}
        )

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Todo | None = None,
    ) -> HttpResponse:
        """Offer, as buttons, the repairs the todo's state allows and the user may make."""
        allowed = self._permissions(request)
        context["repairs"] = [
            (action, label, explanation)
            for state, permission, action, label, explanation in REPAIRS
            if obj is not None and obj.state == state and allowed[permission]
        ]
        return super().render_change_form(request, context, add, change, form_url, obj)

    def _permissions(self, request: HttpRequest) -> dict[str, bool]:
        """Which repairs the user may make, for the templates' buttons and links."""
        return {
            "can_requeue": self.has_requeue_permission(request),
            "can_expire_lease": self.has_expire_lease_permission(request),
            "can_dead_letter": self.has_dead_letter_permission(request),
        }

    def health_view(self, request: HttpRequest) -> HttpResponse:
        """Per-queue counts and a bar chart of them, from partial indexes only."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        rows = stats.queue_health()
        context = {
            **self.admin_site.each_context(request),
            "title": _("Queue health"),
            "opts": self.opts,
            "back": reverse("admin:switchboard_todos_todo_changelist"),
            "rows": rows,
            "chart": HealthChart(rows),
            "now": stats.database_now(),
        }
        return TemplateResponse(request, "admin/switchboard_todos/todo/health.html", context)

    def requeue_all_view(self, request: HttpRequest) -> HttpResponse:
        """Requeue every dead letter matching the list's current filters, after a confirmation."""
        if not self.has_requeue_permission(request):
            raise PermissionDenied
        changelist = self.get_changelist_instance(request)
        dead = changelist.get_queryset(request).filter(state=State.FAILED)
        back = reverse("admin:switchboard_todos_todo_changelist") + changelist.get_query_string()
        if request.method == "POST":
            self.run_operation(request, dead, _requeue_operation())
            return HttpResponseRedirect(back)
        context = {
            **self.admin_site.each_context(request),
            "title": _("Requeue all dead letters matching the filter"),
            "opts": self.opts,
            "count": capped_count(dead),
            "filters": _active_filters(changelist),
            "back": back,
        }
        return TemplateResponse(request, "admin/switchboard_todos/todo/requeue_all.html", context)


#: The detail page's buttons: (state, permission flag, action, label, explanation).
REPAIRS = [
    (
        State.FAILED,
        "can_requeue",
        "requeue_selected",
        _("Requeue this dead letter"),
        _("Back to pending with its attempts reset; workers will run it again"),
    ),
    (
        State.CLAIMED,
        "can_expire_lease",
        "expire_lease_selected",
        _("Expire its lease now"),
        _("The reaper or the next claim takes it back from its worker"),
    ),
    (
        State.PENDING,
        "can_dead_letter",
        "dead_letter_selected",
        _("Dead-letter (cancel)…"),
        _("Asks for a reason first"),
    ),
]


def _active_filters(changelist: ChangeList) -> list[str]:
    """The filters the list applies, as the operator reads them in the sidebar."""
    shown = []
    for spec in changelist.filter_specs:
        for choice in spec.choices(changelist):
            if choice.get("selected") and choice.get("display") and not _is_all(choice):
                shown.append(f"{spec.title}: {choice['display']}")
    if changelist.query:
        shown.append(f"search: {changelist.query}")
    for key, value in changelist.params.items():
        if key.startswith(f"{changelist.date_hierarchy}__"):
            shown.append(f"{key.rsplit('__', 1)[1]}: {value}")
    return shown


def _is_all(choice: Mapping[str, object]) -> bool:
    return str(choice["display"]) == str(_("All"))


class HealthChart:
    """Geometry of the health page's bar chart: one stacked bar per queue, as inline SVG."""

    SEGMENTS: Sequence[tuple[str, str, str]] = (
        ("ready", "ready", "#417690"),
        ("scheduled", "waiting for retry", "#79aec8"),
        ("claimed", "claimed", "#5b9e3f"),
        ("lease_expired", "lease expired", "#e0a800"),
        ("dead", "dead letters", "#ba2121"),
    )
    WIDTH = 600
    LABEL_WIDTH = 160
    ROW_HEIGHT = 24

    def __init__(self, rows: Sequence[stats.QueueHealth]) -> None:
        self.rows = rows
        largest = max((self.total(row) for row in rows), default=0)
        self.scale = (self.WIDTH - self.LABEL_WIDTH - 80) / largest if largest else 0.0
        self.height = self.ROW_HEIGHT * max(len(rows), 1) + 8

    def total(self, row: stats.QueueHealth) -> int:
        return sum(getattr(row, name) for name, _label, _colour in self.SEGMENTS)

    def bars(self) -> list[dict[str, Any]]:
        """Per queue: its label position and its segments' x, width, colour and tooltip."""
        bars = []
        for index, row in enumerate(self.rows):
            y = index * self.ROW_HEIGHT + 4
            x = float(self.LABEL_WIDTH)
            segments = []
            for name, label, colour in self.SEGMENTS:
                count = getattr(row, name)
                if count:
                    width = max(count * self.scale, 1.0)
                    segments.append(
                        {
                            "x": round(x, 1),
                            "width": round(width, 1),
                            "colour": colour,
                            "title": f"{row.queue}: {count} {label}",
                        }
                    )
                    x += width
            bars.append(
                {
                    "queue": row.queue,
                    "y": y,
                    "text_y": y + 14,
                    "segments": segments,
                    "total": self.total(row),
                    "total_x": round(x + 6, 1),
                }
            )
        return bars

    def legend(self) -> list[dict[str, Any]]:
        return [{"label": label, "colour": colour} for _name, label, colour in self.SEGMENTS]


# Events


class TodoInline(ReadOnly, _TodoInline):
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
class EventAdmin(ReadOnly, _EventAdmin):
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
        return _pretty_json(event.payload)
