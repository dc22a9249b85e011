"""A todo's dependencies on its page: its parents and children, and the graph around it.

The graph is drawn on the server as inline SVG (the health page's chart is too): no JavaScript,
every node a link to its todo's page. It holds the todo, its parents and children, and theirs
(two levels each way at most), PER_LEVEL todos a level, so at most 29 nodes; a level with more
says how many it leaves out. Reading it costs two queries, one for a todo without parents or
children: the parents (their ids are in the todo's own row) and the children (found through
todo_edges, in the same query, with how many there are), then the parents of those parents and
the children of those children that are drawn. Of a todo with more than LISTED children, the
LISTED first by id are read (an index range, however many it has).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.contrib.admin.utils import quote
from django.db import router
from django.db.models import F, Func, IntegerField, Q, QuerySet, Subquery
from django.db.models.functions import Left
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from switchboard_todos.admin.colours import COLOURS
from switchboard_todos.admin.databases import PARAMETER
from switchboard_todos.admin.display import json_text
from switchboard_todos.models import State, Todo, TodoEdge

#: Parents, and children, listed in the page's tables; past these, "and N more".
LISTED = 100
#: Todos drawn on each level of the graph but the todo's own.
PER_LEVEL = 7
#: Characters of a parent's result the parents' table shows.
RESULT_CHARS = 60
#: A node's fill and label by what it is now; the colours are every page's (colours.py).
STATUSES = {
    "pending": (COLOURS["ready"], _("pending")),
    "blocked": (COLOURS["blocked"], _("blocked: waiting for other todos")),
    "claimed": (COLOURS["claimed"], _("claimed")),
    "done": (COLOURS["done"], _("done")),
    "failed": (COLOURS["failed"], _("failed (dead letter)")),
}
_COLUMNS = ("id", "state", "kind", "title", "waiting_for", "parents", "created_at")


@dataclass(frozen=True)
class Relative:
    """A todo of the graph, as its page shows it."""

    id: str
    state: str
    kind: str
    title: str
    waiting_for: int
    parents: list[str]
    result_head: str | None = None
    """The head of its result (a parent's, for the table of parents)."""

    @property
    def status(self) -> str:
        """Its state, "blocked" for a pending todo blocked by others."""
        return "blocked" if self.state == State.PENDING and self.waiting_for > 0 else self.state

    @property
    def status_label(self) -> str:
        return str(STATUSES[self.status][1])

    @property
    def label(self) -> str:
        return self.kind or self.title or self.id

    def url(self, alias: str) -> str:
        """Its page, in database `alias` (the page's own)."""
        url = reverse("admin:switchboard_todos_todo_change", args=[quote(self.id)])
        return (
            url if alias == router.db_for_read(Todo) else f"{url}?{urlencode({PARAMETER: alias})}"
        )


@dataclass(frozen=True)
class Level:
    """The todos of one level of the graph, and how many more it has than are drawn."""

    number: int
    todos: list[Relative]
    more: int = 0


@dataclass(frozen=True)
class Dependencies:
    """A todo's parents and children (LISTED of each) and the levels of its graph."""

    alias: str
    todo: Relative
    parents: list[Relative]
    children: list[Relative]
    children_count: int
    """All its children, listed or not."""
    levels: list[Level] = field(default_factory=list)

    @property
    def more_parents(self) -> int:
        return len(self.todo.parents) - len(self.parents)

    @property
    def more_children(self) -> int:
        return self.children_count - len(self.children)


def dependencies(todo: Todo) -> Dependencies | None:
    """The dependencies of `todo`, read from its database; None when it has no parents and no
    children (one query, which finds it has no children)."""
    alias = todo._state.db or router.db_for_read(Todo)
    me = Relative(todo.id, todo.state, todo.kind, todo.title, todo.waiting_for, todo.parents or [])
    listed_parents = me.parents[:LISTED]
    near, children_count = _read(alias, listed_parents, [me.id], (), LISTED, results=True)
    if not me.parents and not children_count:
        return None
    parents = [near[pk] for pk in listed_parents if pk in near]
    children = [relative for pk, relative in near.items() if me.id in relative.parents]
    up, down = parents[:PER_LEVEL], children[:PER_LEVEL]
    drawn = {me.id, *(relative.id for relative in (*parents, *children))}
    above = _unique(pk for parent in up for pk in parent.parents if pk not in drawn)
    far, below_count = _read(
        alias,
        above[:PER_LEVEL],
        [child.id for child in down],
        drawn,
        PER_LEVEL,
        results=False,
    )
    below = [relative for pk, relative in far.items() if pk not in above[:PER_LEVEL]]
    levels = [
        Level(-2, [far[pk] for pk in above[:PER_LEVEL] if pk in far], _beyond(len(above))),
        Level(-1, up, len(me.parents) - len(up)),
        Level(0, [me]),
        Level(1, down, children_count - len(down)),
        Level(2, below, _beyond(below_count)),
    ]
    shown = [level for level in levels if level.todos or level.more > 0]
    return Dependencies(alias, me, parents, children, children_count, shown)


def _read(
    alias: str,
    ids: Sequence[str],
    parents: Sequence[str],
    drawn: Iterable[str],
    limit: int,
    *,
    results: bool,
) -> tuple[dict[str, Relative], int]:
    """The todos of `ids` and the children of `parents` not `drawn` (the first `limit` by id),
    in one query (none for neither), oldest first; and how many such children there are. With
    the heads of their results."""
    if not ids and not parents:
        return {}, 0
    edges = TodoEdge.objects.using(alias).filter(parent_id__in=parents).exclude(child_id__in=drawn)
    children = edges.values("child_id").distinct()
    todos: QuerySet[Todo] = (
        Todo.objects.using(alias)
        .filter(Q(pk__in=ids) | Q(pk__in=children.order_by("child_id")[:limit]))
        .annotate(children_count=_count(edges))
        .order_by("created_at", "id")
    )
    if results:
        todos = todos.annotate(result_head=Left(json_text(F("result")), RESULT_CHARS + 1))
    found, count = {}, 0
    for row in todos.values(*_COLUMNS, "children_count", *(("result_head",) if results else ())):
        head = row.pop("result_head", None)
        count = row.pop("children_count") or 0  # NULL: no parents asked about
        del row["created_at"]
        found[row["id"]] = Relative(
            **{**row, "parents": row["parents"] or []},
            result_head=None if head is None else Truncator(head).chars(RESULT_CHARS),
        )
    return found, count


def _count(edges: QuerySet[TodoEdge]) -> Subquery:
    """How many children `edges` names, as a scalar subquery beside each row read."""
    counted = Func(F("child_id"), template="count(DISTINCT %(expressions)s)")
    return Subquery(
        edges.order_by().annotate(total=counted).values("total"), output_field=IntegerField()
    )


def _unique(ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def _beyond(count: int) -> int:
    return max(0, count - PER_LEVEL)


class DependencyGraph:
    """Geometry of a todo's graph: a column per level, parents left of children, as inline SVG
    (the template admin/switchboard_todos/todo/dependency_graph.html draws it)."""

    NODE_WIDTH = 150
    NODE_HEIGHT = 26
    COLUMN_GAP = 56
    ROW_GAP = 10
    MARGIN = 4
    LABEL_CHARS = 20

    def __init__(self, found: Dependencies) -> None:
        self.found = found
        rows = max(len(level.todos) + (level.more > 0) for level in found.levels)
        self.row_step = self.NODE_HEIGHT + self.ROW_GAP
        self.height = rows * self.row_step - self.ROW_GAP + 2 * self.MARGIN
        step = self.NODE_WIDTH + self.COLUMN_GAP
        self.width = len(found.levels) * step - self.COLUMN_GAP + 2 * self.MARGIN
        self._places: dict[str, tuple[float, float]] = {}
        self._columns: list[tuple[Level, float, float]] = []
        for column, level in enumerate(found.levels):
            x = self.MARGIN + column * step
            used = len(level.todos) + (level.more > 0)
            top = self.MARGIN + (rows - used) * self.row_step // 2
            self._columns.append((level, x, top))
            for row, relative in enumerate(level.todos):
                self._places.setdefault(relative.id, (x, top + row * self.row_step))

    def nodes(self) -> list[dict[str, Any]]:
        """Each todo drawn: its box, fill, label, tooltip and link."""
        drawn = []
        for level, _x, _top in self._columns:
            for relative in level.todos:
                x, y = self._places[relative.id]
                drawn.append(
                    {
                        "x": x,
                        "y": y,
                        "text_x": x + 6,
                        "text_y": y + 17,
                        "colour": STATUSES[relative.status][0],
                        "label": Truncator(relative.label).chars(self.LABEL_CHARS),
                        "title": f"{relative.label} ({relative.id}): {relative.status_label}",
                        "url": relative.url(self.found.alias),
                        "current": level.number == 0,
                    }
                )
        return drawn

    def more(self) -> list[dict[str, Any]]:
        """Under each level that has more todos than are drawn: "and N more"."""
        return [
            {
                "x": x + 6,
                "y": top + len(level.todos) * self.row_step + 17,
                "text": _("and %(count)d more") % {"count": level.more},
            }
            for level, x, top in self._columns
            if level.more > 0
        ]

    def edges(self) -> list[str]:
        """An SVG path from each drawn todo to each drawn todo that waits for it."""
        paths = []
        for level, _x, _top in self._columns:
            for relative in level.todos:
                for parent in relative.parents:
                    if parent in self._places:
                        paths.append(self._path(self._places[parent], self._places[relative.id]))
        return paths

    def _path(self, start: tuple[float, float], end: tuple[float, float]) -> str:
        """A curve from the right of the parent's box to the left of the child's (or, in one
        column, to the right of the child's, bending out)."""
        (x1, y1), (x2, y2) = start, end
        x1, y1, y2 = x1 + self.NODE_WIDTH, y1 + self.NODE_HEIGHT / 2, y2 + self.NODE_HEIGHT / 2
        if x2 + self.NODE_WIDTH == x1:
            bend = x1 + self.COLUMN_GAP / 2
            return f"M{x1:g},{y1:g} C{bend:g},{y1:g} {bend:g},{y2:g} {x1:g},{y2:g}"
        middle = (x1 + x2) / 2
        return f"M{x1:g},{y1:g} C{middle:g},{y1:g} {middle:g},{y2:g} {x2:g},{y2:g}"

    def legend(self) -> list[dict[str, str]]:
        return [{"label": str(label), "colour": colour} for colour, label in STATUSES.values()]
