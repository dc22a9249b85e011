"""Where the SQS endpoint answers: where the URLconf mounts it, and at any path behind
SQSAnywhere; queue URLs are built on the endpoint's URL as the client reached it, and the
signature is checked over the path the client posted to."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from django.urls import include, path

from switchboard_todos.agents import accounts
from switchboard_todos.models import Agent
from switchboard_todos.sqs.mount import POSTED_PATH, SQSAnywhere
from tests.asgi import django_application
from tests.helpers import sqs_headers, sqs_post

#: The URLconf of the tests marked `urls(__name__)`: the endpoint somewhere else than /sqs/.
urlpatterns = [path("aws/queues/", include("switchboard_todos.sqs.urls"))]


@pytest.fixture
def agent(db: None) -> Agent:
    return accounts.create_agent("mounted", claim_queues=["jobs"], create_queues=["jobs"])[0]


@pytest.mark.urls(__name__)
def test_queue_urls_follow_where_the_urlconf_mounts_the_endpoint(
    client: Client, agent: Agent
) -> None:
    queue = "http://testserver/aws/queues/jobs"
    answer = sqs_post(client, agent, "/aws/queues/", "GetQueueUrl", {"QueueName": "jobs"})
    assert answer == {"QueueUrl": queue}
    assert sqs_post(client, agent, "/aws/queues/jobs", "ListQueues", {}) == {"QueueUrls": [queue]}


def call(application: Any, path: str, headers: dict[str, str], body: bytes) -> httpx.Response:
    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            return await client.post(path, content=body, headers=headers)

    return asyncio.run(send())


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("posted", ["/", "/any/where"])
def test_anywhere_answers_sqs_at_the_path_posted_to(agent: Agent, posted: str) -> None:
    """As kombu's `sqs://host:port` posts to `/`; the queue URL is on the same endpoint."""
    application = SQSAnywhere(django_application)
    params = {"QueueName": "jobs"}
    headers = sqs_headers(agent, f"http://testserver{posted}", "GetQueueUrl", params)
    answer = call(application, posted, headers, json.dumps(params).encode())
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"QueueUrl": f"http://testserver{posted.rstrip('/')}/jobs"}
    # Signed for another path: the signature covers the path the client posted to.
    answer = call(application, "/elsewhere", headers, json.dumps(params).encode())
    assert answer.json()["__type"] == "com.amazonaws.sqs#SignatureDoesNotMatch"


def test_anywhere_passes_on_every_other_request() -> None:
    seen: list[dict[str, Any]] = []

    async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope)

    anywhere = SQSAnywhere(application)
    sqs = [(b"x-amz-target", b"AmazonSQS.ListQueues")]
    scopes: list[dict[str, Any]] = [
        {"type": "http", "method": "POST", "path": "/", "headers": sqs},
        {"type": "http", "method": "POST", "path": "/app/x", "root_path": "/app", "headers": sqs},
        {"type": "http", "method": "POST", "path": "/sqs/jobs", "headers": sqs},
        {"type": "http", "method": "GET", "path": "/", "headers": sqs},
        {"type": "http", "method": "POST", "path": "/", "headers": [(b"x-amz-target", b"Other")]},
        {"type": "lifespan"},
    ]
    for scope in scopes:
        asyncio.run(anywhere(scope, None, None))
    assert [(scope.get("path"), scope.get(POSTED_PATH)) for scope in seen] == [
        ("/sqs/", "/"),
        ("/app/sqs/", "/app/x"),
        ("/sqs/jobs", None),
        ("/", None),
        ("/", None),
        (None, None),
    ]


class WithoutSQS:
    urlpatterns: list[Any] = []


def test_anywhere_needs_the_endpoint_in_the_urlconf(settings: Any) -> None:
    settings.ROOT_URLCONF = WithoutSQS
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "headers": [(b"x-amz-target", b"AmazonSQS.X")],
    }
    with pytest.raises(ImproperlyConfigured, match='include\\("switchboard_todos.sqs.urls"\\)'):
        asyncio.run(SQSAnywhere(django_application)(scope, None, None))
