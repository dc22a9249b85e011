"""The one module that imports the Tasks framework: `django.tasks` (Django 6.0+) or the backport.

On Django 5.2, `pip install "switchboard-todos[backport]"` brings `django-tasks` 0.12, and
"django_tasks" goes into INSTALLED_APPS (its system checks hang off its AppConfig). Under
Django 6 the built-in package is used even when the backport is installed too. The backport
0.12 spells two exceptions `InvalidTaskError` and `InvalidTaskBackendError`; its unreleased
master already uses Django's names, so both spellings are accepted.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

#: The package providing the framework here, which is also its app label.
IMPLEMENTATION = "django.tasks" if find_spec("django.tasks") is not None else "django_tasks"

if TYPE_CHECKING or IMPLEMENTATION == "django.tasks":
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
else:
    try:
        from django_tasks import TaskContext, TaskResult, TaskResultStatus, task, task_backends
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskError
        from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json
    except ImportError as error:
        raise ImproperlyConfigured(
            "switchboard_todos.backends needs django.tasks: upgrade to Django 6.0 or later, or "
            'on Django 5.2 install the backport with pip install "switchboard-todos[backport]".'
        ) from error
    try:
        from django_tasks.exceptions import InvalidTask
    except ImportError:
        from django_tasks.exceptions import InvalidTaskError as InvalidTask

__all__ = [
    "IMPLEMENTATION",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
