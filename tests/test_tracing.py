"""OpenTelemetry tracing (switchboard_todos.tracing): one trace from a traced request through
the worker's handler, and from an agent's create; the SDK's in-memory exporter reads the spans.
Without a tracer provider, or without OpenTelemetry at all, nothing is traced or imported."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from django.contrib.admin.utils import quote
from django.test import Client
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from opentelemetry import baggage, context, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from example_project.mcp_agent import call
from switchboard_todos import tracing
from switchboard_todos.agents import accounts
from switchboard_todos.models import State, Todo
from switchboard_todos.sqs import messages
from switchboard_todos.worker import Worker
from tests import tasks, worker_handlers  # noqa: F401 (registers the handlers)
from tests.asgi import serve_mcp
from tests.conftest import ROOT
from tests.helpers import sqs_post

pytestmark = pytest.mark.django_db(transaction=True)

#: A remote caller's trace context, as W3C Trace Context writes it.
TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """A tracer provider of the SDK, global for this test only, that keeps its spans."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    yield exporter
    provider.shutdown()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def one(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = named(exporter, name)
    assert len(found) == 1, [span.name for span in exporter.get_finished_spans()]
    return found[0]


def trace_of(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.trace_id:032x}"


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def parent_of(span: ReadableSpan) -> int:
    """The span id of its parent; 0 for a root span."""
    return 0 if span.parent is None else int(span.parent.span_id)


def linked(span: ReadableSpan) -> set[int]:
    return {link.context.span_id for link in span.links}


def test_a_traced_request_and_the_workers_handler_are_one_trace(
    client: Client, spans: InMemorySpanExporter
) -> None:
    """The webhook's span, the create, the worker's claim, its handler run and the todo's
    settlement are one trace: the handler's span a child of the create's, with its baggage."""
    answer = client.post("/traced-hook/", {"n": 1}, content_type="application/json")
    assert answer.status_code == 202
    todo = Todo.objects.get(pk=answer.json()["todo_id"])
    request = one(spans, "POST /traced-hook/")
    create = one(spans, "create_todo default")
    assert parent_of(create) == span_id(request) and create.kind == SpanKind.PRODUCER
    assert create.attributes == {
        "messaging.system": "switchboard_todos",
        "messaging.operation.type": "create",
        "messaging.operation.name": "create_todo",
        "messaging.destination.name": "default",
        "messaging.message.id": todo.id,
    }
    assert tracing.trace_id(todo.trace_context) == trace_of(request)
    assert json.loads(todo.trace_context or "")["baggage"] == "tenant=acme"

    stats = Worker(max_todos=1).run()
    assert (stats.claimed, stats.done) == (1, 1)
    todo.refresh_from_db()
    assert todo.state == State.DONE
    # The handler ran in its process span, in the request's trace, with the creator's baggage.
    assert todo.result == {"trace_id": trace_of(request), "baggage": {"tenant": "acme"}}
    receive = one(spans, "claim default")
    process = one(spans, "process default")
    settle = one(spans, "complete_many default")
    assert linked(receive) == {span_id(create)}
    assert receive.attributes is not None
    assert receive.attributes["messaging.operation.type"] == "receive"
    assert receive.attributes["messaging.message.id"] == todo.id
    assert parent_of(process) == span_id(create) and process.kind == SpanKind.CONSUMER
    assert process.attributes is not None
    assert process.attributes["messaging.operation.type"] == "process"
    assert process.attributes["messaging.message.id"] == todo.id
    assert process.attributes["messaging.switchboard_todos.attempt"] == 1
    assert trace_of(process) == trace_of(settle) == trace_of(request)
    assert settle.attributes is not None
    assert settle.attributes["messaging.operation.type"] == "settle"


def test_a_failed_handler_run_is_an_error_span_and_its_fail_a_child(
    spans: InMemorySpanExporter,
) -> None:
    with trace.get_tracer("tests").start_as_current_span("producer"):
        todo, _ = Todo.objects.create_todo(kind="test.boom", max_attempts=1)
    Worker(max_todos=1).run()
    process = one(spans, "process default")
    fail = one(spans, "fail default")
    assert process.status.status_code == trace.StatusCode.ERROR
    assert [event.name for event in process.events] == ["exception"]
    assert parent_of(fail) == span_id(process)
    assert trace_of(fail) == tracing.trace_id(Todo.objects.get(pk=todo.pk).trace_context)


def test_a_django_task_enqueued_in_a_span_runs_in_its_trace(spans: InMemorySpanExporter) -> None:
    """django.tasks' enqueue is a create_todo: the task's run in the worker is a child of it."""
    with trace.get_tracer("tests").start_as_current_span("view") as view:
        result = tasks.add.enqueue(2, 3)
    assert tracing.trace_id(Todo.objects.get(pk=result.id).trace_context) == (
        f"{view.get_span_context().trace_id:032x}"
    )
    Worker(max_todos=1).run()
    create = one(spans, "create_todo default")
    assert parent_of(one(spans, "process default")) == span_id(create)


def test_an_agents_create_over_http_joins_its_callers_trace(
    client: Client, spans: InMemorySpanExporter
) -> None:
    """An agent's create with a traceparent header (no instrumentation on the server): the
    create's span is a child of the caller's; another agent's claim and complete link to it."""
    token = accounts.create_agent("maker", claim_queues=["work"], create_queues=["work"])[1]
    answer = client.post(
        "/api/todos/",
        json.dumps({"queue": "work", "kind": "review"}),
        content_type="application/json",
        headers={
            "Authorization": f"Bearer {token}",
            "traceparent": TRACEPARENT,
            "baggage": "user=ada",
        },
    )
    assert answer.status_code == 201, answer.content
    todo = Todo.objects.get(pk=answer.json()["id"])
    create = one(spans, "create_todo work")
    assert trace_of(create) == TRACE and parent_of(create) == int(PARENT, 16)
    assert tracing.trace_id(todo.trace_context) == TRACE
    assert json.loads(todo.trace_context or "")["baggage"] == "user=ada"

    headers = {"Authorization": f"Bearer {token}"}
    claimed = client.post("/api/claim/", "{}", content_type="application/json", headers=headers)
    assert claimed.json()["todos"][0]["id"] == todo.id, claimed.content
    done = client.post(
        f"/api/todos/{todo.id}/complete/", "{}", content_type="application/json", headers=headers
    )
    assert done.status_code == 200, done.content
    assert linked(one(spans, "claim work")) == {span_id(create)}
    complete = one(spans, "complete work")
    # No span was current: the settlement is a child of the creator's span.
    assert parent_of(complete) == span_id(create) and trace_of(complete) == TRACE


def test_a_malformed_traceparent_is_ignored(client: Client, spans: InMemorySpanExporter) -> None:
    token = accounts.create_agent("maker", create_queues=["work"])[1]
    answer = client.post(
        "/api/todos/",
        json.dumps({"queue": "work", "kind": "review"}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}", "traceparent": "00-zz-yy-01"},
    )
    assert answer.status_code == 201, answer.content
    create = one(spans, "create_todo work")
    assert create.parent is None  # a trace of its own
    todo = Todo.objects.get(pk=answer.json()["id"])
    assert tracing.trace_id(todo.trace_context) == trace_of(create)


def test_an_mcp_agents_create_joins_the_trace_of_its_requests_traceparent() -> None:
    """An MCP agent's create_for over streamable HTTP with a traceparent header: the todo
    stores that trace (the SDK carries the request's context to the tool call). The server,
    uvicorn in a child, has no tracer provider: the caller's context is stored all the same."""
    token = accounts.create_agent("mcp-maker", claim_queues=["mcp"], create_queues=["mcp"])[1]

    async def create() -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {token}", "traceparent": TRACEPARENT}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30.0) as http,
            streamable_http_client(f"{url}", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await call(session, "create_for", queue="mcp", kind="review")

    with serve_mcp() as url:
        made = asyncio.run(create())
    todo = Todo.objects.get(pk=made["todo"]["id"])
    assert tracing.trace_id(todo.trace_context) == TRACE


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        (
            {
                "MessageAttributes": {
                    "traceparent": {"DataType": "String", "StringValue": TRACEPARENT}
                }
            },
            TRACE,
        ),
        (
            {
                "MessageSystemAttributes": {
                    "AWSTraceHeader": {
                        "DataType": "String",
                        "StringValue": "Root=1-5759e988-bd862e3fe1be46a994272793;"
                        "Parent=53995c3f42cd8ad8;Sampled=1",
                    }
                }
            },
            "5759e988bd862e3fe1be46a994272793",
        ),
        (
            {
                "MessageSystemAttributes": {
                    "AWSTraceHeader": {"DataType": "String", "StringValue": "Root=nonsense"}
                }
            },
            None,
        ),
    ],
)
def test_sqs_send_message_takes_the_senders_trace_context(
    client: Client, attributes: dict[str, Any], expected: str | None
) -> None:
    """SendMessage's `traceparent` message attribute, else its AWSTraceHeader (X-Ray's)
    system attribute, is the todo's trace context; one it cannot read is ignored. No tracer
    provider is set here: a context is stored all the same, for whoever traces the handling."""
    agent = accounts.create_agent("sender", claim_queues=["jobs"], create_queues=["jobs"])[0]
    sent = sqs_post(
        client,
        agent,
        "/sqs/jobs",
        "SendMessage",
        {"QueueUrl": "http://testserver/sqs/jobs", "MessageBody": "hi", **attributes},
    )
    todo = Todo.objects.get(pk=sent["MessageId"])
    assert tracing.trace_id(todo.trace_context) == expected


def test_sqs_receive_message_gives_the_senders_aws_trace_header(client: Client) -> None:
    """The trace a message was sent in comes back as its AWSTraceHeader system attribute, in
    X-Ray's form, when asked for (and with All); a message sent untraced has none."""
    agent = accounts.create_agent("sender", claim_queues=["jobs"], create_queues=["jobs"])[0]
    header = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
    queue = {"QueueUrl": "http://testserver/sqs/jobs"}
    traced = {"AWSTraceHeader": {"DataType": "String", "StringValue": header}}
    sqs_post(
        client,
        agent,
        "/sqs/jobs",
        "SendMessage",
        {**queue, "MessageBody": "traced", "MessageSystemAttributes": traced},
    )
    sqs_post(client, agent, "/sqs/jobs", "SendMessage", {**queue, "MessageBody": "plain"})
    received = sqs_post(
        client,
        agent,
        "/sqs/jobs",
        "ReceiveMessage",
        {**queue, "MaxNumberOfMessages": 2, "MessageSystemAttributeNames": ["AWSTraceHeader"]},
    )
    found = {message["Body"]: message.get("Attributes") for message in received["Messages"]}
    assert found == {"traced": {"AWSTraceHeader": header}, "plain": None}


def test_an_sqs_trace_header_is_read_within_bounds() -> None:
    """A traceparent attribute wins over AWSTraceHeader; an oversized or odd one is ignored."""
    xray = {
        "AWSTraceHeader": {
            "DataType": "String",
            "StringValue": "Sampled=0;Parent=53995c3f42cd8ad8;"
            "Root=1-5759e988-bd862e3fe1be46a994272793",
        }
    }
    assert messages.trace_carrier({"MessageSystemAttributes": xray}) == {
        "traceparent": "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-00"
    }
    both = {
        "MessageSystemAttributes": xray,
        "MessageAttributes": {"traceparent": {"DataType": "String", "StringValue": TRACEPARENT}},
    }
    assert messages.trace_carrier(both) == {"traceparent": TRACEPARENT}
    huge = {"traceparent": {"DataType": "String", "StringValue": TRACEPARENT + " " * 1024}}
    for entry in (
        {"MessageAttributes": huge},
        {"MessageAttributes": {"traceparent": "not a dict"}},
        {"MessageAttributes": ["not", "a", "dict"]},
        {"MessageSystemAttributes": {"AWSTraceHeader": {"StringValue": 5}}},
        {"MessageSystemAttributes": {"AWSTraceHeader": {"StringValue": "Root=1-5759e988-bd86"}}},
    ):
        assert messages.trace_carrier(entry) == {}, entry


def test_a_span_current_already_wins_over_a_remote_header(spans: InMemorySpanExporter) -> None:
    """An instrumentation's span of the request (which read the header itself) stays the
    parent: the header is made current only when no span is."""
    with (
        trace.get_tracer("tests").start_as_current_span("server") as server,
        tracing.remote({"traceparent": TRACEPARENT}),
    ):
        found = tracing.current_context()
    assert tracing.trace_id(found) == f"{server.get_span_context().trace_id:032x}" != TRACE
    with tracing.remote({"traceparent": TRACEPARENT}):
        assert tracing.trace_id(tracing.current_context()) == TRACE
    assert tracing.current_context() is None


def test_a_claimed_batch_links_to_each_todos_creator(spans: InMemorySpanExporter) -> None:
    """Todos of two traces claimed together: the claim's span links to both creating spans;
    each handler run is a child of its own todo's, and the batch's settlement links to both."""
    tracer = trace.get_tracer("tests")
    for name in ("first", "second"):
        with tracer.start_as_current_span(name):
            Todo.objects.create_many([{"kind": "test.echo", "queue": "batch"}] * 2)
    creates = named(spans, "create_many batch")
    assert len(creates) == 2 and trace_of(creates[0]) != trace_of(creates[1])
    assert creates[0].attributes is not None
    assert creates[0].attributes["messaging.batch.message_count"] == 2

    claimed = Todo.objects.claim_batch("batch", "claimer", None, limit=4)
    assert len(claimed) == 4
    receive = one(spans, "claim batch")
    assert linked(receive) == {span_id(create) for create in creates}
    assert receive.attributes is not None
    assert receive.attributes["messaging.batch.message_count"] == 4
    assert receive.attributes["messaging.client.id"] == "claimer"
    for todo in claimed:
        Todo.objects.release(todo.id, "claimer")

    Worker(queues=["batch"], max_todos=4, concurrency=1).run()
    processes = named(spans, "process batch")
    assert sorted(parent_of(span) for span in processes) == sorted(
        [span_id(creates[0])] * 2 + [span_id(creates[1])] * 2
    )
    settles = named(spans, "complete_many batch")
    assert set().union(*map(linked, settles)) == {span_id(create) for create in creates}


def test_enqueue_many_stores_the_context_of_its_span(spans: InMemorySpanExporter) -> None:
    with trace.get_tracer("tests").start_as_current_span("import"):
        Todo.objects.enqueue_many([{"kind": "test.echo"}, {"kind": "test.echo"}])
    create = one(spans, "enqueue_many default")
    stored = set(Todo.objects.values_list("trace_context", flat=True))
    assert len(stored) == 1
    [context_] = stored
    assert json.loads(context_)["traceparent"].split("-")[2] == f"{span_id(create):016x}"


def test_without_an_active_context_nothing_is_stored(spans: InMemorySpanExporter) -> None:
    """A create with no span current makes its own span (a root), whose context it stores;
    without a tracer provider and no context active, nothing at all."""
    todo, _ = Todo.objects.create_todo(kind="test.echo")
    assert tracing.trace_id(todo.trace_context) == trace_of(one(spans, "create_todo default"))
    trace._TRACER_PROVIDER = None  # no provider: restored by the fixture's monkeypatch
    plain, _ = Todo.objects.create_todo(kind="test.echo")
    token = context.attach(baggage.set_baggage("k", "v"))
    try:
        with_baggage, _ = Todo.objects.create_todo(kind="test.echo")
    finally:
        context.detach(token)
    assert Todo.objects.get(pk=plain.pk).trace_context is None
    assert json.loads(Todo.objects.get(pk=with_baggage.pk).trace_context or "") == {
        "baggage": "k=v"
    }


def test_the_trace_id_is_read_from_what_a_todo_stores() -> None:
    assert tracing.trace_id(json.dumps({"traceparent": TRACEPARENT})) == TRACE
    for stored in (None, "", "{", "[]", '{"traceparent": 5}', '{"traceparent": "00-0-0-0"}'):
        assert tracing.trace_id(stored) is None
    zeros = json.dumps({"traceparent": f"00-{'0' * 32}-{PARENT}-01"})
    assert tracing.trace_id(zeros) is None


def test_the_admin_shows_a_todos_trace_id_only_when_it_has_one(admin_client: Client) -> None:
    traced = Todo.objects.create(kind="k", trace_context=json.dumps({"traceparent": TRACEPARENT}))
    untraced = Todo.objects.create(kind="k")
    page = admin_client.get(f"/admin/switchboard_todos/todo/{quote(traced.pk)}/change/")
    assert page.status_code == 200
    assert TRACE in page.content.decode() and "trace id" in page.content.decode().lower()
    page = admin_client.get(f"/admin/switchboard_todos/todo/{quote(untraced.pk)}/change/")
    assert page.status_code == 200 and "trace id" not in page.content.decode().lower()


#: What the child of the next test runs: the app imported, todos created, claimed and settled,
#: by hand and by a worker, then whether any module of OpenTelemetry was imported.
UNTRACED = """
import sys

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "opentelemetry":
            raise ImportError(f"{name} is blocked")
        return None

if sys.argv[1] == "blocked":
    sys.meta_path.insert(0, Blocker())
import django
django.setup()
from switchboard_todos.models import Todo
from switchboard_todos.worker import Worker
from tests import worker_handlers

Todo.objects.create_todo(kind="test.echo", queue="untraced")
Todo.objects.create_many([{"kind": "test.echo", "queue": "untraced"}] * 2)
Todo.objects.enqueue_many([{"kind": "test.echo", "queue": "untraced"}] * 2)
claimed = Todo.objects.claim_next("untraced", "probe")
Todo.objects.complete(claimed.id, "probe", {"ok": True})
claimed = Todo.objects.claim_next("untraced", "probe")
Todo.objects.fail(claimed.id, "probe", "no")
stats = Worker(queues=["untraced"], max_todos=3).run()
assert stats.done == 3, stats
loaded = sorted(name for name in sys.modules if name.partition(".")[0] == "opentelemetry")
print("loaded:", loaded)
"""


@pytest.mark.parametrize("mode", ["blocked", "installed"])
def test_untraced_programs_import_nothing_of_opentelemetry(
    subprocess_env: dict[str, str], mode: str
) -> None:
    """Not installed (an import blocker), or installed but never imported by the program:
    creates, claims, settlements and the worker run, and OpenTelemetry stays unimported."""
    done = subprocess.run(
        [sys.executable, "-c", UNTRACED, mode],
        cwd=ROOT,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "loaded: []" in done.stdout, done.stdout
    assert set(Todo.objects.values_list("trace_context", flat=True)) == {None}
