"""Settings for the test suite: a real PostgreSQL, chosen as the example project's is."""

from __future__ import annotations

from importlib.util import find_spec

import environ

from devtools.database import ensure_database_url

env = environ.Env()

SECRET_KEY = "switchboard-todos-tests"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]

DATABASES = {"default": env.db_url_config(ensure_database_url())}
# A second database on the same server. It holds todos only where tests/test_databases.py
# places queues in it (SWITCHBOARD_TODOS_QUEUE_DATABASES, empty here), and its test database is
# made only when a test asks for it.
DATABASES["eu"] = {**DATABASES["default"], "NAME": f"{DATABASES['default']['NAME']}_eu"}
DATABASE_ROUTERS = ["switchboard_todos.placement.QueueRouter"]
# The live-server tests run uvicorn with a small pool, as docs/agents.md advises.
if pool_size := env.int("DATABASE_POOL_SIZE", default=0):
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {"min_size": 1, "max_size": pool_size}

# A test's worker child may shorten the connection timeouts (tests/test_worker_process.py).
SWITCHBOARD_TODOS_DATABASE_OPTIONS = env.json("SWITCHBOARD_TODOS_DATABASE_OPTIONS", default={})
# The pooler in front of the database for the processes a test starts (tests/test_pooler.py).
SWITCHBOARD_TODOS_POOLER = env.str("SWITCHBOARD_TODOS_POOLER", default=None)
# Queues placed in `eu` for the processes a test starts (tests/test_databases.py).
SWITCHBOARD_TODOS_QUEUE_DATABASES = env.json("SWITCHBOARD_TODOS_QUEUE_DATABASES", default={})
# Periodic todos for the processes a test starts (the scheduler's systemd unit).
SWITCHBOARD_TODOS_SCHEDULES = env.json("SWITCHBOARD_TODOS_SCHEDULES", default={})
# The long polls one agent may have waiting at once, for the server a test starts
# (tests/test_long_polls_live.py).
SWITCHBOARD_TODOS_AGENT_MAX_WAITS = env.int("SWITCHBOARD_TODOS_AGENT_MAX_WAITS", default=8)
# The requests one agent may have in flight at once (tests/test_request_cap.py): by default
# twice its long polls, as the setting's default is, so that a test raising the long-poll cap
# above its flood (tests/test_long_polls_live.py) has every poll admitted.
SWITCHBOARD_TODOS_AGENT_MAX_CONCURRENT = env.int(
    "SWITCHBOARD_TODOS_AGENT_MAX_CONCURRENT", default=2 * SWITCHBOARD_TODOS_AGENT_MAX_WAITS
)
# The todos one agent may create a minute, for the server a test starts (tests/test_sqs_brokers.py:
# a quota of 5 rather than 600 real sends).
SWITCHBOARD_TODOS_AGENT_MAX_CREATES_PER_MINUTE = env.int(
    "SWITCHBOARD_TODOS_AGENT_MAX_CREATES_PER_MINUTE", default=600
)
# And the seconds' worth of those it may create at once (tests/test_sqs_brokers.py: a minute's).
SWITCHBOARD_TODOS_AGENT_BURST_SECONDS = env.float(
    "SWITCHBOARD_TODOS_AGENT_BURST_SECONDS", default=6.0
)

# Off, as the suite speaks plain HTTP; the live servers of the HTTPS tests turn them on in their
# environment (tests/test_api_live.py, tests/test_mcp.py).
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=False)
SECURE_PROXY_SSL_HEADER = env.tuple("SECURE_PROXY_SSL_HEADER", default=None)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
# What Prometheus sends to /metrics (tests/test_metrics.py).
SWITCHBOARD_TODOS_METRICS_TOKEN = "metrics-test-token"

WEBHOOK_SECRETS = {"github": "github-test-secret", "example": "example-test-secret"}
WEBHOOK_MAX_BYTES = 64 * 1024

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    # Serves the admin's CSS and JavaScript to the browser test (pytest-django's live_server).
    "django.contrib.staticfiles",
    "django.contrib.postgres",  # the Agent model's ArrayField (a system check on Django 6)
    "switchboard_todos",
    "example_project",
]
if find_spec("django.tasks") is None:  # Django 5.2: the Tasks framework is the backport
    INSTALLED_APPS.append("django_tasks")

TASKS = {
    "default": {
        "BACKEND": "switchboard_todos.backends.TodoBackend",
        "QUEUES": ["default", "other"],
    },
}

STATIC_URL = "static/"

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "tests.urls"

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

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
