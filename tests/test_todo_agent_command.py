"""`manage.py todo_agent`: create, rotate, revoke and list remote agents from the shell."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from switchboard_todos.agents import service
from switchboard_todos.exceptions import NotAuthenticated
from switchboard_todos.models import Agent
from switchboard_todos.sqs.signing import secret_for

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


def test_the_burst_is_whole_seconds_of_one_to_sixty_shown_when_set() -> None:
    run("create", "bot", "--burst-seconds", "30")
    assert Agent.objects.get(name="bot").burst_seconds == 30
    assert run("limits", "bot")[0].endswith(", burst_seconds 30.")
    with pytest.raises(CommandError, match="at most 60"):
        run("limits", "bot", "--burst-seconds", "61")
    with pytest.raises(CommandError, match="at most 60"):
        run("create", "other", "--burst-seconds", "61")
    assert not Agent.objects.filter(name="other").exists()
    with pytest.raises(CommandError, match="burst-seconds"):
        run("limits", "bot", "--burst-seconds", "0.5")
    assert Agent.objects.get(name="bot").burst_seconds == 30
    run("limits", "bot", "--burst-seconds", "default")
    assert "burst_seconds" not in run("limits", "bot")[0]


BROKER = {
    "max_held": 1000,
    "max_creates_per_minute": 30000,
    "max_bytes_per_minute": 268435456,
    "max_fails_per_minute": 30000,
    "burst_seconds": 60,
}


def quotas(name: str) -> dict[str, int | None]:
    return {field: getattr(Agent.objects.get(name=name), field) for field in BROKER}


def test_the_broker_preset_sets_its_quotas_at_creation_and_on_an_agent() -> None:
    lines = run(
        "create", "celery", "--queue", "celery", "--create-queue", "celery", "--preset", "broker"
    )
    assert quotas("celery") == BROKER
    assert Agent.objects.get(name="celery").max_attempts_limit is None
    shown = "max_held 1000, max_creates_per_minute 30000, max_attempts_limit 25 (default), "
    shown += "max_bytes_per_minute 268435456, max_fails_per_minute 30000, burst_seconds 60"
    assert lines[0].endswith(f"; {shown}.")
    assert run("list")[0].endswith(shown)
    run("create", "producer", "--create-queue", "celery")
    assert quotas("producer") == dict.fromkeys(BROKER)
    assert run("limits", "producer", "--preset", "broker") == [f"Agent 'producer': {shown}."]
    assert quotas("producer") == BROKER


def test_quota_options_given_with_the_preset_win() -> None:
    run("create", "celery", "--preset", "broker", "--max-held", "5000")
    assert quotas("celery") == {**BROKER, "max_held": 5000}
    run("limits", "celery", "--preset", "broker", "--max-creates-per-minute", "default")
    assert quotas("celery") == {**BROKER, "max_creates_per_minute": None}


def test_an_unknown_preset_is_refused() -> None:
    with pytest.raises(CommandError, match="invalid choice: 'tenant'"):
        run("create", "celery", "--preset", "tenant")
    assert not Agent.objects.exists()


def test_sqs_credentials_refuses_a_secret_key_made_anew_by_every_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new process of these settings derives another key: the server would refuse the secret."""
    run("create", "celery", "--queue", "celery")
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.throwaway_key_settings")
    out = StringIO()
    with pytest.raises(CommandError, match="that every process of tests.throwaway_key_settings"):
        call_command("todo_agent", "sqs-credentials", "celery", stdout=out)
    assert out.getvalue() == ""


def test_sqs_credentials_takes_a_fixed_sqs_key_beside_a_secret_key_made_anew(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    run("create", "celery", "--queue", "celery")
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.throwaway_key_settings")
    monkeypatch.setenv("SWITCHBOARD_TODOS_SQS_KEY", "a-fixed-key-of-the-sqs-secrets")
    settings.SWITCHBOARD_TODOS_SQS_KEY = "a-fixed-key-of-the-sqs-secrets"
    assert run("sqs-credentials", "celery") == [
        "AWS_ACCESS_KEY_ID=celery",
        f"AWS_SECRET_ACCESS_KEY={secret_for(Agent.objects.get(name='celery'))}",
    ]


def test_sqs_credentials_warns_when_a_new_process_cannot_be_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run("create", "celery", "--queue", "celery")
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.no_such_settings")
    out, err = StringIO(), StringIO()
    call_command("todo_agent", "sqs-credentials", "celery", stdout=out, stderr=err)
    assert "could not be asked which SQS server key it derives" in err.getvalue()
    assert out.getvalue().splitlines()[0] == "AWS_ACCESS_KEY_ID=celery"
