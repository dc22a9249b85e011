"""Counting without COUNT(*) over the table: exact when small, PostgreSQL's estimate when large."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet
from django.utils.formats import localize

if TYPE_CHECKING:
    _Paginator = Paginator[Any]
else:  # Django's classes take no type parameters at run time.
    _Paginator = Paginator


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
