"""Remote agents: create one, rotate or revoke its token; each token is shown once, then gone.

Only a hash of a token is stored, so the page that follows a creation or a rotation is the only
place the token ever appears: it is rendered in that response (never put in a message, which
would keep it in the session or a cookie) and is not cached. Every creation, rotation and
revocation is in the agent's history (LogEntry).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.core.validators import MinValueValidator
from django.db.models import QuerySet
from django.forms import IntegerField, ModelForm
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from switchboard_todos.admin.base import RefusesNul
from switchboard_todos.agents import accounts
from switchboard_todos.agents.service import quotas
from switchboard_todos.agents.tokens import issue_token
from switchboard_todos.models import Agent

if TYPE_CHECKING:
    AgentModelAdmin = admin.ModelAdmin[Agent]
else:  # Django's classes take no type parameters at run time.
    AgentModelAdmin = admin.ModelAdmin


#: Where save_model leaves a new agent's token for response_add (on the agent, never on the
#: admin, which every request shares).
ISSUED = "_issued_token"
#: Not `is_active`: an agent is revoked and made active again by the actions only, so that
#: re-activation always comes with a new token (agents/accounts.py).
FIELDS = [
    "name",
    "claim_queues",
    "create_queues",
    "max_held",
    "max_creates_per_minute",
    "max_attempts_limit",
    "max_bytes_per_minute",
    "max_fails_per_minute",
    "burst_seconds",
    "room_now",
    "token_prefix",
    "token_generation",
    "created_at",
    "last_seen_at",
]
#: The quotas (empty: the project's SWITCHBOARD_TODOS_AGENT_* setting). Zero would refuse every
#: claim or creation for good, which revoking the token or dropping a grant says better.
QUOTAS = [
    "max_held",
    "max_creates_per_minute",
    "max_attempts_limit",
    "max_bytes_per_minute",
    "max_fails_per_minute",
    "burst_seconds",
]


if TYPE_CHECKING:
    AgentModelForm = ModelForm[Agent]
else:
    AgentModelForm = ModelForm


class AgentForm(AgentModelForm):
    """The agent's fields (the admin chooses which), its quotas at least 1."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in QUOTAS:
            field = self.fields.get(name)
            if isinstance(field, IntegerField):
                field.min_value = 1
                field.validators.append(MinValueValidator(1))
                field.widget.attrs["min"] = 1


@admin.register(Agent)
class AgentAdmin(RefusesNul, AgentModelAdmin):
    """The agents, their grants and their tokens' state; tokens change through actions only."""

    list_display = [
        "name",
        "is_active",
        "token_prefix",
        "claim_queues",
        "create_queues",
        "created_at",
        "last_seen_at",
    ]
    list_filter = ["is_active"]
    search_fields = ["name"]
    actions = ["rotate_tokens", "revoke_tokens"]
    form = AgentForm

    def get_readonly_fields(self, request: HttpRequest, obj: Agent | None = None) -> list[str]:
        """Tokens are never edited; a name never changes, as the todos it held keep it."""
        readonly = ["room_now", "token_prefix", "token_generation", "created_at", "last_seen_at"]
        return readonly if obj is None else ["name", *readonly]

    def get_fields(self, request: HttpRequest, obj: Agent | None = None) -> Any:
        return FIELDS

    @admin.display(description=_("room now"))
    def room_now(self, obj: Agent) -> str:
        """What its paced quotas let it write at once now, by the database's clock."""
        if obj.pk is None:
            return "-"
        creations, written, fails = quotas.room(obj)
        return gettext(
            "%(creations)d creations, %(bytes)d bytes of JSON, %(fails)d fails or releases"
        ) % {
            "creations": creations,
            "bytes": written,
            "fails": fails,
        }

    def save_model(
        self, request: HttpRequest, obj: Agent, form: ModelForm[Agent], change: bool
    ) -> None:
        if not change:
            issued = issue_token()
            obj.token_hash, obj.token_prefix = issued.hash, issued.prefix
            setattr(obj, ISSUED, issued.token)
        super().save_model(request, obj, form, change)

    def response_add(
        self, request: HttpRequest, obj: Agent, post_url_continue: str | None = None
    ) -> HttpResponse:
        return self._show_tokens(
            request, _("The new agent's token"), {obj.name: getattr(obj, ISSUED)}
        )

    @admin.action(description=_("Rotate the tokens of the selected agents"), permissions=["change"])
    def rotate_tokens(self, request: HttpRequest, queryset: QuerySet[Agent]) -> HttpResponse:
        """New tokens (the old ones stop working at once); revoked agents are active again."""
        issued = {}
        for agent in queryset:
            issued[agent.name] = accounts.rotate_token(agent)
            self.log_change(
                request, agent, f"Rotated its token (generation {agent.token_generation})."
            )
        return self._show_tokens(request, _("New tokens"), issued)

    @admin.action(description=_("Revoke the tokens of the selected agents"), permissions=["change"])
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[Agent]) -> None:
        agents = list(queryset)
        for agent in agents:
            accounts.revoke(agent)
            self.log_change(request, agent, "Revoked its token.")
        count = len(agents)
        self.message_user(
            request,
            ngettext(
                "Revoked the token of %(count)d agent.",
                "Revoked the tokens of %(count)d agents.",
                count,
            )
            % {"count": count},
        )

    def _show_tokens(
        self, request: HttpRequest, title: Any, tokens: dict[str, str]
    ) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": self.opts,
            "tokens": sorted(tokens.items()),
            "back": reverse("admin:switchboard_todos_agent_changelist"),
        }
        response = TemplateResponse(request, "admin/switchboard_todos/agent/tokens.html", context)
        add_never_cache_headers(response)
        return response
