"""The test settings' ASGI application, served by uvicorn in the live-server tests."""

from __future__ import annotations

from django.core.asgi import get_asgi_application

application = get_asgi_application()
