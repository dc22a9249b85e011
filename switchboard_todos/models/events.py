"""The `events` table: inbound deliveries that todos can point back to."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from switchboard_todos.events import EventManager
from switchboard_todos.models.defaults import db_now, db_prefixed_uuid, new_event_id


class Event(models.Model):
    """An inbound delivery (a webhook, say) that todos can point back to."""

    id = models.TextField(
        primary_key=True, default=new_event_id, db_default=db_prefixed_uuid("ev"), editable=False
    )
    source = models.TextField(db_default="")
    kind = models.TextField(db_default="")
    payload = models.JSONField(default=dict, db_default=models.Value({}, models.JSONField()))
    delivery_id = models.TextField(null=True, blank=True)
    received_at = models.DateTimeField(db_default=db_now())

    objects = EventManager()

    class Meta:
        db_table = "events"
        ordering = ["-received_at"]
        indexes = [
            # The admin's event list, newest first, without sorting the table.
            models.Index(fields=["received_at"], name="idx_events_received"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["source", "delivery_id"],
                condition=Q(delivery_id__isnull=False),
                name="idx_events_delivery",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.source}:{self.kind} {self.id}"
