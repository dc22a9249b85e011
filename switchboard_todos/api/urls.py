"""`path("api/", include("switchboard_todos.api.urls"))` mounts the agents' HTTP API."""

from __future__ import annotations

from switchboard_todos.api.views import api

# include() names the namespace after app_name: the one the API reverses its routes in.
urlpatterns, _ninja, app_name = api.urls
