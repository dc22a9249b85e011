from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from example_project import views
from switchboard_todos import metrics

webhook_patterns = [path("hooks/<slug:source>/", views.webhook, name="webhook")]

# Prometheus scrapes the queue's numbers here, with the metrics token (docs/operating.md).
urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics.view, name="metrics"),
    # The remote agents' HTTP API (docs/agents.md).
    path("api/", include("switchboard_todos.api.urls")),
    path("sqs/", include("switchboard_todos.sqs.urls")),
    *webhook_patterns,
]
