"""The agents' admin: tokens shown once after creation or rotation, every change in the history."""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client

from switchboard_todos.agents import accounts, service
from switchboard_todos.exceptions import NotAuthenticated
from switchboard_todos.models import Agent

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/switchboard_todos/agent/"
TOKEN = re.compile(r"sbt_[A-Za-z0-9_-]{43}")


def shown_tokens(response: object) -> list[str]:
    return TOKEN.findall(response.content.decode())  # type: ignore[attr-defined]


def history(agent: Agent) -> list[tuple[int, str]]:
    entries = LogEntry.objects.filter(object_id=str(agent.pk)).order_by("action_time", "id")
    return [(entry.action_flag, entry.get_change_message()) for entry in entries]


def test_add_shows_the_token_once_and_records_the_addition(admin_client: Client) -> None:
    response = admin_client.post(
        f"{CHANGELIST}add/", {"name": "bot", "claim_queues": "work,more", "create_queues": "inbox"}
    )
    assert response.status_code == 200
    assert "no-cache" in response["Cache-Control"] or "no-store" in response["Cache-Control"]
    [token] = shown_tokens(response)
    agent = service.authenticate(token)
    assert (agent.name, agent.claim_queues, agent.create_queues) == (
        "bot",
        ["work", "more"],
        ["inbox"],
    )
    assert [flag for flag, _ in history(agent)] == [ADDITION]
    assert token not in admin_client.get(f"{CHANGELIST}{agent.pk}/change/").content.decode()
    assert token not in admin_client.get(CHANGELIST).content.decode()


def test_add_refuses_bad_names_and_queues(admin_client: Client) -> None:
    for form in ({"name": "has space"}, {"name": "bot", "claim_queues": "work,bad name"}):
        response = admin_client.post(f"{CHANGELIST}add/", form)
        assert response.status_code == 200 and response.context["errors"]
    assert not Agent.objects.exists()


def test_rotate_shows_new_tokens_and_records_each(admin_client: Client) -> None:
    first, old_token = accounts.create_agent("bot", claim_queues=["work"])
    second, _ = accounts.create_agent("other")
    accounts.revoke(second)
    response = admin_client.post(
        CHANGELIST, {"action": "rotate_tokens", "_selected_action": [first.pk, second.pk]}
    )
    tokens = shown_tokens(response)
    assert sorted(service.authenticate(token).name for token in tokens) == ["bot", "other"]
    with pytest.raises(NotAuthenticated):
        service.authenticate(old_token)
    assert history(first) == [(CHANGE, "Rotated its token (generation 2).")]


def test_revoke_refuses_the_token_and_records_it(admin_client: Client) -> None:
    agent, token = accounts.create_agent("bot")
    response = admin_client.post(
        CHANGELIST, {"action": "revoke_tokens", "_selected_action": [agent.pk]}, follow=True
    )
    assert "Revoked the token of 1 agent." in response.content.decode()
    with pytest.raises(NotAuthenticated, match="revoked"):
        service.authenticate(token)
    assert history(agent) == [(CHANGE, "Revoked its token.")]


def test_the_name_and_the_token_cannot_be_edited(admin_client: Client) -> None:
    agent, token = accounts.create_agent("bot", claim_queues=["work"])
    admin_client.post(
        f"{CHANGELIST}{agent.pk}/change/",
        {
            "name": "renamed",
            "claim_queues": "work,more",
            "create_queues": "",
            "is_active": "on",
            "token_hash": "x",
            "token_prefix": "x",
        },
    )
    agent.refresh_from_db()
    assert agent.name == "bot" and agent.claim_queues == ["work", "more"]
    assert service.authenticate(token).pk == agent.pk


def test_a_user_without_the_change_permission_cannot_rotate(client: Client) -> None:
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_agent"))
    client.force_login(user)
    agent, token = accounts.create_agent("bot")
    response = client.post(CHANGELIST, {"action": "rotate_tokens", "_selected_action": [agent.pk]})
    assert shown_tokens(response) == []
    assert service.authenticate(token).pk == agent.pk


def test_quotas_are_edited_in_the_admin_and_at_least_one(admin_client: Client) -> None:
    agent, _ = accounts.create_agent("bot", claim_queues=["work"])
    form = {"claim_queues": "work", "create_queues": "", "is_active": "on"}
    page = admin_client.get(f"{CHANGELIST}{agent.pk}/change/").content.decode()
    assert "SWITCHBOARD_TODOS_AGENT_MAX_HELD" in page  # empty takes the setting
    refused = admin_client.post(f"{CHANGELIST}{agent.pk}/change/", {**form, "max_held": "0"})
    assert refused.status_code == 200 and refused.context["errors"]
    admin_client.post(
        f"{CHANGELIST}{agent.pk}/change/",
        {**form, "max_held": "3", "max_creates_per_minute": "", "max_attempts_limit": "9"},
    )
    agent.refresh_from_db()
    assert (agent.max_held, agent.max_creates_per_minute, agent.max_attempts_limit) == (3, None, 9)


def test_the_burst_is_edited_from_one_to_sixty(admin_client: Client) -> None:
    agent, _ = accounts.create_agent("bot", claim_queues=["work"])
    form = {"claim_queues": "work", "create_queues": "", "is_active": "on"}
    for value in ("0", "61"):
        refused = admin_client.post(
            f"{CHANGELIST}{agent.pk}/change/", {**form, "burst_seconds": value}
        )
        assert refused.status_code == 200 and refused.context["errors"]
    admin_client.post(f"{CHANGELIST}{agent.pk}/change/", {**form, "burst_seconds": "30"})
    assert Agent.objects.get(pk=agent.pk).burst_seconds == 30


def test_the_agent_page_shows_the_room_its_paced_quotas_have_now(admin_client: Client) -> None:
    """By the database's clock (which stands still in the test's transaction): 6 s of 600
    creations and 16 MiB a minute at once; 3 s owed of the creations leave half of them."""
    agent, _ = accounts.create_agent("bot", claim_queues=["work"])
    page = admin_client.get(f"{CHANGELIST}{agent.pk}/change/").content.decode()
    assert "60 creations, 1677721 bytes of JSON" in page
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todo_agents SET creates_paid_until = now() + interval '3 seconds' "
            "WHERE id = %s",
            [agent.pk],
        )
    page = admin_client.get(f"{CHANGELIST}{agent.pk}/change/").content.decode()
    assert "30 creations, 1677721 bytes of JSON" in page
