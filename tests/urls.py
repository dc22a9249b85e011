from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from example_project.urls import webhook_patterns
from switchboard_todos import metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics.view),
    path("api/", include("switchboard_todos.api.urls")),
    path("sqs/", include("switchboard_todos.sqs.urls")),
    *webhook_patterns,
]
