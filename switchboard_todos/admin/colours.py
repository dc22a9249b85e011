"""One colour per state of a todo, for every page that draws one: the health page's chart, the
dependency graph and the todo list's state column.

Green means done and nothing else; amber is a claim being worked on, orange a claim whose lease
lapsed, red a dead letter; the pending todos are blues (ready, and waiting for a time) and grey
(blocked by other todos).
"""

from __future__ import annotations

from django.utils.html import format_html
from django.utils.safestring import SafeString

#: Each state as the pages tell them apart, by name: its colour.
COLOURS = {
    "ready": "#417690",
    "waiting": "#79aec8",
    "blocked": "#8a8a8a",
    "claimed": "#e0a800",
    "lease_expired": "#c05b00",
    "done": "#5b9e3f",
    "failed": "#ba2121",
}


def swatch(status: str) -> SafeString:
    """A small square of `status`'s colour, as inline SVG (an attribute, not a style: a strict
    Content-Security-Policy allows it)."""
    return format_html(
        '<svg class="switchboard-swatch" width="10" height="10" aria-hidden="true">'
        '<rect width="10" height="10" rx="2" fill="{}"/></svg>',
        COLOURS[status],
    )
