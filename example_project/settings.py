"""Settings of the example project, all from the environment through django-environ.

DEBUG is off unless DEBUG=1, and then SECRET_KEY must be set (with DEBUG on, a throwaway key is
made per process); the HTTPS protections are on unless DEBUG is. docs/example.md lists every
variable, and a production set that passes `manage.py check --deploy`.
"""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured
from django.core.management.utils import get_random_secret_key

from switchboard_todos.conf import DEFAULTS

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

DEBUG = env.bool("DEBUG", default=False)
SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set. Set it in the environment to a long random value, e.g. "
            "SECRET_KEY=$(python -c 'import secrets; print(secrets.token_urlsafe(50))'), "
            "or set DEBUG=1 for local development."
        )
    # Local development only: a new key per process, so sessions end when the process does.
    SECRET_KEY = get_random_secret_key()

ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

# HTTPS. Behind a proxy that terminates TLS, set
# SECURE_PROXY_SSL_HEADER=HTTP_X_FORWARDED_PROTO,https (and have the proxy set that header), or
# the redirect to HTTPS never ends.
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=not DEBUG)
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=not DEBUG)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=not DEBUG)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
SECURE_PROXY_SSL_HEADER = env.tuple("SECURE_PROXY_SSL_HEADER", default=None)

USE_TZ = True
TIME_ZONE = "UTC"

if not os.environ.get("DATABASE_URL"):
    # Local development in this repository only: the local server or a throwaway one
    # (devtools/database.py, docs/example.md). A deployment sets DATABASE_URL.
    from devtools.database import ensure_database_url

    ensure_database_url()
DATABASES = {"default": env.db_url("DATABASE_URL")}
# Django's connection pool: up to DATABASE_POOL_SIZE connections per process (0: none, and each
# request opens a connection of its own). 32 is twice an agent's requests in flight
# (SWITCHBOARD_TODOS_AGENT_MAX_CONCURRENT): one agent at its cap leaves the other half to the
# server's own threads and to the other agents. Keep processes x this, plus the workers' and the
# reaper's connections, below PostgreSQL's max_connections (docs/operating.md).
if pool_size := env.int("DATABASE_POOL_SIZE", default=32):
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {"min_size": 1, "max_size": pool_size}

# Inbound webhooks (example_project/webhooks.py): WEBHOOK_SECRETS=github=s3cret,shop=0ther
# gives each source its HMAC secret; a source without one answers 404.
WEBHOOK_SECRETS: dict[str, str] = env.dict("WEBHOOK_SECRETS", default={})
WEBHOOK_MAX_BYTES = env.int("WEBHOOK_MAX_BYTES", default=1024 * 1024)

# Prometheus scrapes /metrics with the header Authorization: Bearer <METRICS_TOKEN>; staff users
# logged in to the admin see it too. Unset, only staff users do (docs/operating.md).
SWITCHBOARD_TODOS_METRICS_TOKEN = env.str("METRICS_TOKEN", default="")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",  # the Agent model's ArrayField (a system check on Django 6)
    "switchboard_todos",
    "example_project",
]
if find_spec("django.tasks") is None:  # Django 5.2: the Tasks framework is the backport
    INSTALLED_APPS.append("django_tasks")

# django.tasks (example_project/tasks.py): each task is stored as a todo, run by todo_worker.
TASKS = {"default": {"BACKEND": "switchboard_todos.backends.TodoBackend", "QUEUES": ["default"]}}

# Retry backoff of failed todos, in seconds; `manage.py demo` shortens it for its children.
SWITCHBOARD_TODOS_BACKOFF_BASE = env.float(
    "SWITCHBOARD_TODOS_BACKOFF_BASE", default=DEFAULTS["BACKOFF_BASE"]
)
SWITCHBOARD_TODOS_BACKOFF_MAX = env.float(
    "SWITCHBOARD_TODOS_BACKOFF_MAX", default=DEFAULTS["BACKOFF_MAX"]
)
SWITCHBOARD_TODOS_BACKOFF_JITTER = env.float(
    "SWITCHBOARD_TODOS_BACKOFF_JITTER", default=DEFAULTS["BACKOFF_JITTER"]
)

# A periodic todo (docs/schedules.md): the reaper enqueues it once a minute; the handler in
# todo_handlers.py counts the todos in each state.
SWITCHBOARD_TODOS_SCHEDULES = {
    "todo-census": {"cron": "* * * * *", "kind": "example.minutely", "title": "Todo census"},
}

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"
STATIC_URL = "static/"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

LOG_LEVEL = env.str("LOG_LEVEL", default="INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "{asctime} {levelname} {name}: {message}", "style": "{"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    # Django's own console handler prints with DEBUG on; this one replaces it, not doubles it.
    "loggers": {"django": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False}},
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
