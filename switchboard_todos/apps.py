"""App configuration: registers the system checks."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SwitchboardTodosConfig(AppConfig):
    name = "switchboard_todos"
    label = "switchboard_todos"
    verbose_name = _("Switchboard todos")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from switchboard_todos import checks

        checks.register()
