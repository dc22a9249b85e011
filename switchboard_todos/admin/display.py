"""How the pages show what is stored: JSON, progress notes, failure histories, links."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.admin.utils import quote
from django.db.models import Expression, F, Func, TextField
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.formats import localize
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

FAILURE_COLUMNS = (
    _("attempt"),
    _("owner"),
    _("claimed at"),
    _("failed at"),
    _("error type"),
    _("message"),
    _("details"),
)


def pretty_json(value: Any) -> SafeString:
    """JSON indented and sorted, or a dash for NULL."""
    if value is None:
        return format_html("<p>{}</p>", "—")
    return format_html(
        '<pre class="switchboard-json">{}</pre>',
        json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True),
    )


def json_text(value: Expression | F) -> Func:
    """A JSON column as text, computed in the database (`#>> '{}'`): a string as its text,
    unquoted; any other value as JSON. Cut it there (Left) to read only a head."""
    return Func(value, template="(%(expressions)s #>> '{}')", output_field=TextField())


def progress_head(head: str | None, length: int) -> str:
    """The first `length` characters of a progress note as text (a string note unquoted),
    `head` holding at most one more, so that a longer note ends in an ellipsis."""
    return "—" if head is None else Truncator(head).chars(length)


def event_link(event_id: str | None) -> SafeString | str:
    """A link to an event's admin page from its id, without loading the event."""
    return _link("event", event_id)


def todo_link(todo_id: str | None) -> SafeString | str:
    """A link to a todo's admin page from its id, without loading the todo."""
    return _link("todo", todo_id)


def _link(model: str, pk: str | None) -> SafeString | str:
    if pk is None:
        return "—"
    # The admin escapes "_" (and more) in ids in its URLs: "ev_40…" unescaped would be "ev@…".
    url = reverse(f"admin:switchboard_todos_{model}_change", args=[quote(pk)])
    return format_html('<a href="{}">{}</a>', url, pk)


def failure_table(errors: Any, dropped: int = 0) -> SafeString | str:
    """A todo's failure history as a table, one row per failed or expired attempt; `dropped`
    earlier ones were not kept (SWITCHBOARD_TODOS_MAX_ERRORS_KEPT), which its caption says."""
    entries = [entry for entry in errors or [] if isinstance(entry, dict)]
    if not entries:
        return str(_("No failed attempts."))
    rows = []
    for entry in entries:
        recorded = entry.get("error")
        error: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
        rows.append(
            (
                entry.get("attempt", "—"),
                entry.get("owner") or "—",
                _when(entry.get("claimed_at")),
                _when(entry.get("at")),
                error.get("type") or "—",
                error.get("message") or "",
                _error_details(error),
            )
        )
    header = format_html_join("", "<th scope='col'>{}</th>", [(c,) for c in FAILURE_COLUMNS])
    body = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        rows,
    )
    caption = (
        format_html(
            "<caption>{}</caption>",
            ngettext(
                "The %(count)d failed attempt before these is not kept.",
                "The %(count)d failed attempts before these are not kept.",
                dropped,
            )
            % {"count": dropped},
        )
        if dropped
        else ""
    )
    return format_html(
        '<table class="switchboard-failures">{}<thead><tr>{}</tr></thead><tbody>{}</tbody></table>',
        caption,
        header,
        body,
    )


def _error_details(error: dict[str, Any]) -> SafeString | str:
    """The traceback, folded, then any fields of the error beyond type, message and traceback."""
    extra = {k: v for k, v in error.items() if k not in ("type", "message", "traceback")}
    details: SafeString | str = (
        format_html(
            "<details><summary>{}</summary><pre>{}</pre></details>",
            _("traceback"),
            error["traceback"],
        )
        if error.get("traceback")
        else ""
    )
    if extra:
        details += pretty_json(extra)
    return details


def _when(value: Any) -> str:
    """A timestamp from the failure history (ISO text in the JSON), in the admin's zone."""
    moment = parse_datetime(value) if isinstance(value, str) else None
    if moment is None:
        return "—" if value is None else str(value)
    return str(localize(timezone.localtime(moment)))
