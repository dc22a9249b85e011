"""Mount with `path("sqs/", include("switchboard_todos.sqs.urls"))`: clients then use
`endpoint_url="<base>/sqs/"`, and queue URLs are `<base>/sqs/<queue>`."""

from __future__ import annotations

from django.urls import path

from switchboard_todos.sqs.views import endpoint

app_name = "switchboard_todos_sqs"
urlpatterns = [
    path("", endpoint, name="endpoint"),
    path("<str:queue>", endpoint, name="queue"),
]
