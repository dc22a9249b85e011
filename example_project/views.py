"""The example project's views: the webhook endpoint, kept thin over `webhooks`."""

from __future__ import annotations

import logging

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from example_project import webhooks

logger = logging.getLogger(__name__)


@csrf_exempt
def webhook(request: HttpRequest, source: str) -> JsonResponse:
    """Take one delivery: 202 with the new todo's id, or 200 with the same id for a repeat."""
    if request.method != "POST":
        refused = JsonResponse(
            {"error": f"Webhooks are delivered with POST, not {request.method}."}, status=405
        )
        refused["Allow"] = "POST"
        return refused
    try:
        delivery = webhooks.parse(request, source)
        received = webhooks.store(delivery)
    except webhooks.Rejected as rejected:
        logger.warning("Webhook from %r refused (%s): %s", source, rejected.status, rejected)
        return JsonResponse({"error": rejected.message}, status=rejected.status)
    logger.info(
        "Webhook %s %s from %r: todo %s",
        delivery.delivery_id,
        "stored" if received.created else "repeated",
        source,
        received.todo.id if received.todo else None,
    )
    return JsonResponse(
        {
            "todo_id": received.todo.id if received.todo else None,
            "event_id": received.event.id,
            "duplicate": not received.created,
        },
        status=202 if received.created else 200,
    )
