"""Where the SQS endpoint answers: where the URLconf mounts it, and at any path behind
SQSAnywhere; queue URLs are built on the endpoint's URL as the client reached it, and the
signature is checked over the path the client posted to."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.test import Client
from django.urls import include, path

from switchboard_todos.agents import accounts
from switchboard_todos.models import Agent
from switchboard_todos.sqs.mount import SQSAnywhere
from switchboard_todos.sqs.views import MAX_BODY
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


class WithoutSQS:
    """A URLconf that does not mount the endpoint: SQSAnywhere serves it all the same."""

    urlpatterns: list[Any] = []


@pytest.fixture
def anywhere() -> Iterator[SQSAnywhere]:
    """Django's application behind SQSAnywhere; its threads' connections closed after."""
    anywhere = SQSAnywhere(django_application)
    yield anywhere
    anywhere.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("urlconf", ["tests.urls", WithoutSQS])
@pytest.mark.parametrize("posted", ["/", "/any/where", "/sqs/"])
def test_anywhere_answers_sqs_at_the_path_posted_to(
    anywhere: SQSAnywhere, agent: Agent, posted: str, urlconf: Any, settings: Any
) -> None:
    """As kombu's `sqs://host:port` posts to `/`; the queue URL is on the same endpoint."""
    settings.ROOT_URLCONF = urlconf
    params = {"QueueName": "jobs"}
    headers = sqs_headers(agent, f"http://testserver{posted}", "GetQueueUrl", params)
    answer = call(anywhere, posted, headers, json.dumps(params).encode())
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"QueueUrl": f"http://testserver{posted.rstrip('/')}/jobs"}
    # Signed for another path: the signature covers the path the client posted to.
    answer = call(anywhere, "/elsewhere", headers, json.dumps(params).encode())
    assert answer.json()["__type"] == "com.amazonaws.sqs#SignatureDoesNotMatch"


@pytest.mark.django_db(transaction=True)
def test_anywhere_knows_a_queue_url_of_the_urlconf(anywhere: SQSAnywhere, agent: Agent) -> None:
    headers = sqs_headers(agent, "http://testserver/sqs/jobs", "ListQueues", {})
    answer = call(anywhere, "/sqs/jobs", headers, b"{}")
    assert answer.json() == {"QueueUrls": ["http://testserver/sqs/jobs"]}


def test_anywhere_passes_every_other_request_on() -> None:
    """Django answers what is not an SQS POST, and a host ALLOWED_HOSTS refuses."""
    seen: list[tuple[str, str]] = []

    async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append((scope["method"], scope["path"]))
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    anywhere = SQSAnywhere(application)
    sqs = {"X-Amz-Target": "AmazonSQS.ListQueues"}

    async def requests() -> list[int]:
        transport = httpx.ASGITransport(app=anywhere)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            return [
                (await client.get("/", headers=sqs)).status_code,
                (await client.post("/", headers={"X-Amz-Target": "Other.X"})).status_code,
                (await client.post("/", headers={**sqs, "Host": "evil.example"})).status_code,
            ]

    assert asyncio.run(requests()) == [404, 404, 404]
    assert seen == [("GET", "/"), ("POST", "/"), ("POST", "/")]
    anywhere.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("size", "status", "says"),
    [(MAX_BODY + 100, 400, "exceeds 1048576 bytes"), (3 * MAX_BODY, 400, "exceeds 1048576")],
)
def test_anywhere_refuses_a_body_too_large(
    anywhere: SQSAnywhere, agent: Agent, size: int, status: int, says: str
) -> None:
    """Past the endpoint's limit (below Django's), the request is refused unread."""
    body = b" " * size
    headers = sqs_headers(agent, "http://testserver/", "ListQueues", {})
    answer = call(anywhere, "/", headers, body)
    assert (answer.status_code, says in answer.text) == (status, True), answer.text


@pytest.mark.parametrize("declared", [True, False], ids=["Content-Length", "chunked"])
def test_anywhere_reads_no_more_than_the_limit_of_a_huge_unsigned_body(
    anywhere: SQSAnywhere, declared: bool
) -> None:
    """An unsigned 300 MB POST with X-Amz-Target: refused by its Content-Length before a byte
    of it is read, or, sent in chunks, once it passes the limit; never spooled to disk."""
    chunk = b" " * 65536
    total = 300 * 1024 * 1024
    pulled = 0
    answer: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": pulled < total}

    async def send(message: dict[str, Any]) -> None:
        answer.append(message)

    headers = [(b"host", b"testserver"), (b"x-amz-target", b"AmazonSQS.ListQueues")]
    if declared:
        headers.append((b"content-length", str(total).encode()))
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "raw_path": b"/",
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "scheme": "http",
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 1234),
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
    }
    asyncio.run(anywhere(scope, receive, send))
    assert answer[0]["status"] == 400
    assert b"exceeds 1048576 bytes" in answer[1]["body"]
    assert pulled == (0 if declared else MAX_BODY + len(chunk))
