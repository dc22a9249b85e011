"""The health page's bar chart: one stacked bar per queue, drawn as inline SVG by the template."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from switchboard_todos import stats
from switchboard_todos.admin.colours import COLOURS


class HealthChart:
    """Geometry of the health page's bar chart: one stacked bar per queue, as inline SVG."""

    #: Each count of stats.QueueHealth drawn, its label, and its state's colour (colours.py).
    SEGMENTS: Sequence[tuple[str, str, str]] = (
        ("ready", "ready", COLOURS["ready"]),
        ("scheduled", "scheduled or retrying", COLOURS["waiting"]),
        ("blocked", "blocked", COLOURS["blocked"]),
        ("claimed", "claimed", COLOURS["claimed"]),
        ("lease_expired", "lease expired", COLOURS["lease_expired"]),
        ("dead", "dead letters", COLOURS["failed"]),
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
