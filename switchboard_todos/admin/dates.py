"""The date hierarchy at millions of rows: the years, months and days that hold a todo, cheaply."""

from __future__ import annotations

from datetime import datetime, timedelta, tzinfo
from typing import Any, Literal

from django.db import connections
from django.db.models import Max, Min, QuerySet
from django.utils import timezone

from switchboard_todos.models import Todo


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
