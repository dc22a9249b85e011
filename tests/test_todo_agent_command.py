"""`manage.py todo_agent`: create, rotate, revoke and list remote agents from the shell."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from switchboard_todos.agents import service
from switchboard_todos.exceptions import NotAuthenticated
from switchboard_todos.models import Agent

pytestmark = pytest.mark.django_db


def run(*args: str) -> list[str]:
    out = StringIO()
    call_command("todo_agent", *args, stdout=out)
    return out.getvalue().splitlines()


def test_create_prints_the_token_alone_on_the_last_line() -> None:
    lines = run("create", "bot", "--queue", "work", "--queue", "more", "--create-queue", "inbox")
    token = lines[-1]
    agent = service.authenticate(token)
    assert agent.name == "bot"
    assert agent.claim_queues == ["work", "more"] and agent.create_queues == ["inbox"]
    assert "claims from work, more; creates in inbox" in lines[0]


def test_rotate_and_revoke() -> None:
    old = run("create", "bot", "--queue", "work")[-1]
    new = run("rotate", "bot")[-1]
    assert new != old and service.authenticate(new).name == "bot"
    with pytest.raises(NotAuthenticated):
        service.authenticate(old)
    assert run("revoke", "bot") == ["Revoked the token of agent 'bot'."]
    with pytest.raises(NotAuthenticated, match="revoked"):
        service.authenticate(new)
    assert service.authenticate(run("rotate", "bot")[-1]).is_active


def test_list_shows_status_prefix_and_grants_never_the_token() -> None:
    token = run("create", "bot", "--queue", "work")[-1]
    run("create", "other", "--create-queue", "inbox")
    run("revoke", "other")
    lines = run("list")
    assert [line.split("\t")[:2] for line in lines] == [["bot", "active"], ["other", "revoked"]]
    assert token[:10] in lines[0] and token not in lines[0]
    assert "last seen never" in lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["create", "bad name"], "Agent name"),
        (["create", "bot", "--queue", "bad queue"], "queue"),
        (["rotate", "ghost"], "No agent is named 'ghost'"),
        (["revoke", "ghost"], "No agent is named 'ghost'"),
    ],
)
def test_errors_are_command_errors(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        run(*args)
    assert not Agent.objects.exists()


def test_create_refuses_a_taken_name() -> None:
    run("create", "bot")
    with pytest.raises(CommandError, match="exists already"):
        run("create", "bot")


def test_quotas_are_set_at_creation_changed_and_reset_to_the_settings() -> None:
    run("create", "bot", "--queue", "work", "--max-held", "3", "--max-creates-per-minute", "60")
    agent = Agent.objects.get(name="bot")
    assert (agent.max_held, agent.max_creates_per_minute, agent.max_attempts_limit) == (3, 60, None)
    assert run("limits", "bot", "--max-held", "default", "--max-attempts", "7") == [
        "Agent 'bot': max_held 100 (default), max_creates_per_minute 60, max_attempts_limit 7."
    ]
    agent.refresh_from_db()
    assert (agent.max_held, agent.max_creates_per_minute, agent.max_attempts_limit) == (None, 60, 7)
    assert run("list")[0].endswith(
        "max_held 100 (default), max_creates_per_minute 60, max_attempts_limit 7"
    )


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_quotas_are_whole_numbers_of_one_or_more(value: str) -> None:
    with pytest.raises(CommandError, match="max-held"):
        run("create", "bot", "--max-held", value)
    assert not Agent.objects.exists()
