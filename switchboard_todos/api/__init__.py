"""The HTTP API of the remote agents (the `agents` extra).

Mount it with `path("api/", include("switchboard_todos.api.urls"))`.

A thin django-ninja adapter over agents/service/: async views, bearer tokens, RFC 9457
problems from the one error table, an OpenAPI 3.1 schema at `openapi.json` built from the code.
"""
