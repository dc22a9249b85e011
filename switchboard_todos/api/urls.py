"""`path("api/", include("switchboard_todos.api.urls"))` mounts the agents' HTTP API."""

from __future__ import annotations

from django.urls import re_path

from switchboard_todos.api.views import api, unknown_route

# include() names the namespace after app_name: the one the API reverses its routes in.
routes, _ninja, app_name = api.urls
urlpatterns = [*routes, re_path(r"^(?P<path>.*)$", unknown_route)]
