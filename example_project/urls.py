from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from example_project import views

webhook_patterns = [path("hooks/<slug:source>/", views.webhook, name="webhook")]

urlpatterns = [
    path("admin/", admin.site.urls),
    # The remote agents' HTTP API (docs/agents.md).
    path("api/", include("switchboard_todos.api.urls")),
    *webhook_patterns,
]
