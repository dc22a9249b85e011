"""The test settings with a SECRET_KEY made anew by every process, as the example project makes
one under DEBUG=1 without SECRET_KEY: what `todo_agent sqs-credentials` refuses
(tests/test_todo_agent_command.py). SWITCHBOARD_TODOS_SQS_KEY comes from the environment."""

from __future__ import annotations

import environ
from django.core.management.utils import get_random_secret_key

from tests.settings import *  # noqa: F403

SECRET_KEY = get_random_secret_key()
SWITCHBOARD_TODOS_SQS_KEY = environ.Env().str("SWITCHBOARD_TODOS_SQS_KEY", default="")
