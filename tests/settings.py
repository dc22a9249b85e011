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
