"""`path("api/", include("switchboard_todos.api.urls"))` mounts the agents' HTTP API.

Every answer under the prefix is a problem when it is an error: ninja's routes, a method a
route does not take (405), and any path that is no route (404), control characters included.
"""

from __future__ import annotations

from django.urls import URLPattern, re_path

from switchboard_todos.api.problems import methods_as_problems
from switchboard_todos.api.views import api, unknown_route

# include() names the namespace after app_name: the one the API reverses its routes in.
routes, _ninja, app_name = api.urls
urlpatterns = [
    *(methods_as_problems(route) if isinstance(route, URLPattern) else route for route in routes),
    re_path(r"^(?P<path>[\s\S]*)$", unknown_route),
]
