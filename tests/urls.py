from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from example_project.urls import webhook_patterns

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("switchboard_todos.api.urls")),
    path("sqs/", include("switchboard_todos.sqs.urls")),
    *webhook_patterns,
]
