"""An agent Celery uses as its broker, set up as docs/celery.md says, on a live uvicorn whose
default quota of creations is 5 a minute rather than 600: the broker preset's agent sends past
it where a default agent is throttled, and the documented retries make a throttled producer
wait for room instead of raising."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError
from celery import Celery
from django.core.management import call_command
from django.db.models import F

from switchboard_todos.models import Agent, Todo
from switchboard_todos.sqs.signing import secret_for
from tests.asgi import serve
from tests.conftest import child_environment
from tests.helpers import documented_transport_options, wait_until

pytestmark = [pytest.mark.clients, pytest.mark.django_db(transaction=True)]

#: The server's SWITCHBOARD_TODOS_AGENT_MAX_CREATES_PER_MINUTE.
QUOTA = 5
#: The attempts botocore makes in its default (legacy) mode: the first and 4 retries.
DEFAULT_ATTEMPTS = 5
TASK = "tests.celery_tasks.add"


@pytest.fixture(scope="module")
def host(django_db_setup: None) -> Iterator[str]:
    environment = {**child_environment(), "DATABASE_POOL_SIZE": "8"}
    environment["SWITCHBOARD_TODOS_AGENT_MAX_CREATES_PER_MINUTE"] = str(QUOTA)
    # A minute's quota at once, as the default agent's set-up would send it (paced at 6 s, 5 a
    # minute is one at once): the preset's burst is what is compared.
    environment["SWITCHBOARD_TODOS_AGENT_BURST_SECONDS"] = "60"
    with serve(environment) as (api, process):
        yield api.removesuffix("/api").removeprefix("http://")
        process.terminate()
        output = process.communicate(timeout=30)[0]
    assert "Traceback" not in output, output


@pytest.fixture
def producer(host: str) -> Iterator[Callable[..., Celery]]:
    """A Celery app sending as an agent with `broker_transport_options`, closed after."""
    apps: list[Celery] = []

    def connect(agent: Agent, options: dict[str, Any]) -> Celery:
        app = Celery("producer", broker=f"sqs://{agent.name}:{secret_for(agent)}@{host}")
        app.conf.broker_transport_options = options
        apps.append(app)
        return app

    yield connect
    for app in apps:
        app.pool.force_close_all()
        app.close()


def agent(name: str, *options: str) -> Agent:
    call_command("todo_agent", "create", name, "--create-queue", "celery", *options)
    return Agent.objects.get(name=name)


def throttled_attempts(client: Any) -> list[int]:
    """The attempts of the client's sends that the server throttled, listed as they happen."""
    refused: list[int] = []

    def seen(response: Any = None, attempts: int = 0, **kwargs: Any) -> None:
        if response is not None and response[1].get("Error", {}).get("Code") == "RequestThrottled":
            refused.append(attempts)

    client.meta.events.register("needs-retry.sqs.SendMessage", seen)
    return refused


def test_a_broker_agent_sends_past_the_default_quota_where_a_default_agent_is_throttled(
    producer: Callable[..., Celery],
) -> None:
    documented = documented_transport_options()
    # The set-up before the preset, without botocore's retries: the refusal shows at once, where
    # by default botocore gives up after 4 retries within 15 s.
    no_retries = {"retries": {"total_max_attempts": 1}}
    plain = producer(agent("plain"), {**documented, "client-config": no_retries})
    with plain.producer_or_acquire() as sender:
        for key in range(QUOTA):
            plain.send_task(TASK, (key,), producer=sender)
        with pytest.raises(ClientError) as throttled:
            plain.send_task(TASK, (QUOTA,), producer=sender)
    assert throttled.value.response["Error"]["Code"] == "RequestThrottled"
    assert "max_creates_per_minute" in str(throttled.value)

    broker = producer(agent("celery", "--preset", "broker"), documented)
    with broker.producer_or_acquire() as sender:
        throttles = throttled_attempts(sender.channel.sqs())
        for key in range(4 * QUOTA):
            broker.send_task(TASK, (key,), producer=sender)
    assert throttles == []
    assert Todo.objects.filter(source="agent:plain").count() == QUOTA
    assert Todo.objects.filter(source="agent:celery").count() == 4 * QUOTA


def test_a_throttled_producer_waits_for_room_with_the_documented_retries(
    producer: Callable[..., Celery],
) -> None:
    """The send past the quota is refused more times than botocore's default retries allow, and
    sent once the quota has room: its debt is moved (the quota's clock) rather than waited
    for. A minute more of it first, so that the 12 s a creation takes to refill at 5 a minute
    cannot come within botocore's retries (up to 15 s)."""
    plain = agent("plain")
    app = producer(plain, documented_transport_options())
    with app.producer_or_acquire() as sender, ThreadPoolExecutor(1) as thread:
        throttles = throttled_attempts(sender.channel.sqs())
        for key in range(QUOTA):
            app.send_task(TASK, (key,), producer=sender)
        Agent.objects.filter(pk=plain.pk).update(
            creates_paid_until=F("creates_paid_until") + timedelta(minutes=1)
        )
        past = thread.submit(app.send_task, TASK, (QUOTA,), producer=sender)
        wait_until(
            lambda: len(throttles) >= DEFAULT_ATTEMPTS,
            "as many refusals as botocore's default retries end with",
            timeout=60,
        )
        Agent.objects.filter(pk=plain.pk).update(
            creates_paid_until=F("creates_paid_until") - timedelta(minutes=2)
        )
        past.result(timeout=60)  # raises if the retries gave up
    assert len(throttles) >= DEFAULT_ATTEMPTS
    assert Todo.objects.filter(source="agent:plain").count() == QUOTA + 1
