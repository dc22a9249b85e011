"""`path("api/", include("switchboard_todos.api.urls"))` mounts the agents' HTTP API.

Every answer under the prefix is a problem when it is an error: ninja's routes, a method a
route does not take (405), and any path that is no route (404), control characters included,
the prefix itself too (ninja's page there is an HTML 404, and a CSRF refusal of a POST).
"""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, re_path

from switchboard_todos.api.problems import methods_as_problems
from switchboard_todos.api.views import api, unknown_route

#: The name of ninja's route of the prefix itself, which its schema reverses to find the prefix.
ROOT = "api-root"


def _answering_problems(route: URLPattern | URLResolver) -> URLPattern | URLResolver:
    """`route` with its refusals as problems; ninja's page of the prefix, the 404 of no route."""
    if not isinstance(route, URLPattern):
        return route
    if route.name == ROOT:
        return URLPattern(route.pattern, unknown_route, name=ROOT)
    return methods_as_problems(route)


# include() names the namespace after app_name: the one the API reverses its routes in.
routes, _ninja, app_name = api.urls
urlpatterns = [*map(_answering_problems, routes), re_path(r"^[\s\S]*$", unknown_route)]
