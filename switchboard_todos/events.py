"""`Event.objects`: storing inbound deliveries (webhooks, say) once, however often they come.

Senders deliver at least once and send again on any doubt; the delivery's id, scoped by its
source, is what recognises a repeat. The unique index on (source, delivery_id) decides, so
concurrent copies store one row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models, router

from switchboard_todos import validation
from switchboard_todos.sql import event_queries

if TYPE_CHECKING:
    from switchboard_todos.models import Event


class EventManager(models.Manager["Event"]):
    """The queries Django gives every model, plus `record`."""

    def record(
        self,
        *,
        source: str,
        kind: str = "",
        payload: dict[str, Any] | None = None,
        delivery_id: str | None = None,
    ) -> tuple[Event, bool]:
        """Store a delivery; a repeat of a stored (source, delivery_id) returns that event.

        Returns (event, created). Without a delivery id every call stores a new event. One
        INSERT; a repeat adds the SELECT of the stored event. Bad input raises InvalidTodo
        before anything is written.
        """
        params = {
            "source": validation.text(source, "source", validation.SOURCE_MAX_LENGTH),
            "kind": validation.text(kind, "kind", validation.KIND_MAX_LENGTH),
            "payload": validation.payload(payload),
            "delivery_id": None
            if delivery_id is None
            else validation.text(
                delivery_id,
                "delivery_id",
                validation.IDEMPOTENCY_KEY_MAX_LENGTH,
                required=True,
            ),
        }
        alias = self._db or router.db_for_write(self.model)
        inserted = list(self.raw(event_queries["record_event"], params, using=alias))
        if inserted:
            return inserted[0], True
        # The conflicting row is committed by now (the INSERT waited for it), and this new
        # statement's snapshot sees it.
        stored = self.using(alias).get(source=params["source"], delivery_id=params["delivery_id"])
        return stored, False
