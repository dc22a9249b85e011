"""The example project's settings, read from the environment in a fresh process each."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from typing import Any

import pytest

from switchboard_todos.agents import accounts
from switchboard_todos.sqs.signing import secret_for
from tests.conftest import ROOT

PRODUCTION = {
    "SECRET_KEY": secrets.token_urlsafe(50),
    "ALLOWED_HOSTS": "switchboard.example.com",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "1",
    "SECURE_HSTS_PRELOAD": "1",
    "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
    "WEBHOOK_SECRETS": "github=s3cret=,shop=0ther",
    "WEBHOOK_MAX_BYTES": "2048",
}

#: Printed by a child process: the settings these tests look at.
SHOW = """
import json, django
from django.conf import settings
django.setup()
names = ["DEBUG", "SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "SECURE_PROXY_SSL_HEADER",
         "WEBHOOK_SECRETS", "WEBHOOK_MAX_BYTES", "INSTALLED_APPS"]
print(json.dumps({name: getattr(settings, name) for name in names}))
"""


def example(
    subprocess_env: dict[str, str], environment: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    """Run `args` with the example project's settings and exactly `environment` for them."""
    env = {
        name: value
        for name, value in subprocess_env.items()
        if name not in PRODUCTION and name not in ("DEBUG", "SECRET_KEY")
    }
    env.update(environment, DJANGO_SETTINGS_MODULE="example_project.settings")
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_check_deploy_is_clean_with_production_values(subprocess_env: dict[str, str]) -> None:
    """`check --deploy` reports nothing, not even a warning, for a production environment."""
    checked = example(
        subprocess_env, PRODUCTION, "manage.py", "check", "--deploy", "--fail-level", "WARNING"
    )
    assert checked.returncode == 0, checked.stderr
    assert "System check identified no issues" in checked.stdout


def test_production_values_are_read(subprocess_env: dict[str, str]) -> None:
    """DEBUG is off by default; HTTPS protections, proxy header and webhook settings apply."""
    shown = example(subprocess_env, PRODUCTION, "-c", SHOW)
    assert shown.returncode == 0, shown.stderr
    values = json.loads(shown.stdout)
    assert "example_project" in values.pop("INSTALLED_APPS")  # so its handlers are discovered
    assert values == {
        "DEBUG": False,
        "SECURE_SSL_REDIRECT": True,
        "SESSION_COOKIE_SECURE": True,
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
        "WEBHOOK_SECRETS": {"github": "s3cret=", "shop": "0ther"},
        "WEBHOOK_MAX_BYTES": 2048,
    }


def test_debug_runs_without_a_secret_key_and_over_plain_http(
    subprocess_env: dict[str, str],
) -> None:
    """DEBUG=1 makes a throwaway key and drops the HTTPS redirect, for local development."""
    shown = example(subprocess_env, {"DEBUG": "1"}, "-c", SHOW)
    assert shown.returncode == 0, shown.stderr
    values = json.loads(shown.stdout)
    assert (values["DEBUG"], values["SECURE_SSL_REDIRECT"]) == (True, False)
    assert (values["WEBHOOK_SECRETS"], values["WEBHOOK_MAX_BYTES"]) == ({}, 1024 * 1024)


@pytest.mark.parametrize("debug", [None, "0"])
def test_no_secret_key_without_debug_is_refused(
    subprocess_env: dict[str, str], debug: str | None
) -> None:
    """DEBUG off (the default) and no SECRET_KEY: the process stops, saying how to set one."""
    environment = {} if debug is None else {"DEBUG": debug}
    checked = example(subprocess_env, environment, "manage.py", "check")
    assert checked.returncode != 0
    assert "ImproperlyConfigured: SECRET_KEY is not set." in checked.stderr
    assert "or set DEBUG=1 for local development" in checked.stderr


def test_tasks_and_backoff_settings(subprocess_env: dict[str, str]) -> None:
    """django.tasks goes to the todo backend; the retry backoff can be set from the environment."""
    show = (
        "import json, django\nfrom django.conf import settings\ndjango.setup()\n"
        "from switchboard_todos.conf import conf\n"
        "print(json.dumps([settings.TASKS['default']['BACKEND'], conf.BACKOFF_BASE, "
        "conf.BACKOFF_MAX, conf.BACKOFF_JITTER]))"
    )
    for name in [name for name in subprocess_env if name.startswith("SWITCHBOARD_TODOS_")]:
        del subprocess_env[name]
    defaults = example(subprocess_env, {"DEBUG": "1"}, "-c", show)
    assert defaults.returncode == 0, defaults.stderr
    assert json.loads(defaults.stdout) == ["switchboard_todos.backends.TodoBackend", 5, 3600, 0.5]
    environment = {
        "DEBUG": "1",
        "SWITCHBOARD_TODOS_BACKOFF_BASE": "0.5",
        "SWITCHBOARD_TODOS_BACKOFF_MAX": "10",
        "SWITCHBOARD_TODOS_BACKOFF_JITTER": "0",
    }
    shortened = example(subprocess_env, environment, "-c", show)
    assert shortened.returncode == 0, shortened.stderr
    assert json.loads(shortened.stdout)[1:] == [0.5, 10, 0]


def test_the_database_has_a_connection_pool_unless_told_otherwise(
    subprocess_env: dict[str, str],
) -> None:
    """32 connections a process by default (docs/operating.md sizes it); DATABASE_POOL_SIZE
    changes it, and 0 turns the pool off."""
    show = (
        "import json, django\nfrom django.conf import settings\ndjango.setup()\n"
        "print(json.dumps(settings.DATABASES['default'].get('OPTIONS', {}).get('pool')))"
    )
    subprocess_env.pop("DATABASE_POOL_SIZE", None)
    pools = []
    for environment in ({}, {"DATABASE_POOL_SIZE": "8"}, {"DATABASE_POOL_SIZE": "0"}):
        shown = example(subprocess_env, {"DEBUG": "1", **environment}, "-c", show)
        assert shown.returncode == 0, shown.stderr
        pools.append(json.loads(shown.stdout))
    assert pools == [{"min_size": 1, "max_size": 32}, {"min_size": 1, "max_size": 8}, None]


@pytest.mark.django_db(transaction=True)
def test_sqs_credentials_need_a_secret_key_the_server_shares(
    subprocess_env: dict[str, str], settings: Any
) -> None:
    """Under DEBUG=1 without SECRET_KEY each process makes its own key, so each would derive
    another SQS secret, and the server refuse it: the command refuses, exit status 1. With a
    SECRET_KEY set, it prints the secret a server with that key derives."""
    agent = accounts.create_agent("celery", create_queues=["celery"])[0]
    command = ("manage.py", "todo_agent", "sqs-credentials", "celery")
    throwaway = example(subprocess_env, {"DEBUG": "1"}, *command)
    assert throwaway.returncode == 1
    assert "SECRET_KEY) that every process of example_project.settings makes anew" in (
        throwaway.stderr
    )
    assert throwaway.stdout == ""
    fixed = example(
        subprocess_env, {"DEBUG": "1", "SECRET_KEY": PRODUCTION["SECRET_KEY"]}, *command
    )
    assert fixed.returncode == 0, fixed.stderr
    settings.SECRET_KEY = PRODUCTION["SECRET_KEY"]
    assert fixed.stdout.splitlines() == [
        "AWS_ACCESS_KEY_ID=celery",
        f"AWS_SECRET_ACCESS_KEY={secret_for(agent)}",
    ]
