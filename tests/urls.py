from __future__ import annotations

import json

from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt

from example_project.urls import webhook_patterns
from switchboard_todos import metrics
from switchboard_todos.models import Todo


@csrf_exempt
def traced_hook(request: HttpRequest) -> JsonResponse:
    """A webhook as a traced project serves it (tests/test_tracing.py): the request's span
    current, as opentelemetry-instrumentation-django makes it, while its todo is created."""
    from opentelemetry import baggage, context, trace

    tracer = trace.get_tracer("tests.urls")
    token = context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        with tracer.start_as_current_span("POST /traced-hook/", kind=trace.SpanKind.SERVER):
            todo, _ = Todo.objects.create_todo(kind="test.traced", payload=json.loads(request.body))
    finally:
        context.detach(token)
    return JsonResponse({"todo_id": todo.id}, status=202)


urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics.view),
    path("api/", include("switchboard_todos.api.urls")),
    path("sqs/", include("switchboard_todos.sqs.urls")),
    path("traced-hook/", traced_hook),
    *webhook_patterns,
]
