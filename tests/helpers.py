"""What several test modules use; their shared fixtures are in conftest.py."""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from django.db import connection, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.test import Client
from psycopg import pq

from switchboard_todos.models import Agent, Todo

#: The type of conftest's `make_todo` fixture.
MakeTodo = Callable[..., Todo]
#: The statements a claim from queues runs (managers/claiming.py picks one by its limit and
#: whether it may be lean): full, lean, each also for a few todos, and lean for one.
CLAIM_STATEMENTS = ("claim_next", "claim_next_few", "claim_ready", "claim_ready_few", "claim_one")


def entry_size(entry: Any) -> int:
    """Bytes of an entry's JSON as PostgreSQL writes jsonb out (what its `size` counts)."""
    return len(json.dumps(entry, ensure_ascii=False).encode())


def own_wal(write: Callable[[], Any]) -> int:
    """Bytes of WAL that `write` writes, run in a transaction of its own: the records of that
    transaction alone, read back with pg_walinspect once committed (so in a test with
    transaction=True), less their full-page images. The server's WAL position moves with
    every session's writes: CI's other leg, on the same server, once made a measured statement
    look twice as dear. And a full-page image is written with the first change to a page after
    each checkpoint, which comes when the server's WAL or clock says, not the write: a
    checkpoint between two measured writes doubled the second (CI: 472,006 then 988,467 bytes,
    with images counted twice, as `record_length` already holds them). A server without
    pg_walinspect (before PostgreSQL 15, or built without contrib) gives the position's move
    instead, images and all."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = 'pg_walinspect')"
        )
        (inspectable,) = cursor.fetchone()
        if inspectable:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT (pg_current_xact_id()::text::numeric % 4294967296)::bigint,"
                " pg_current_wal_insert_lsn()"
            )
            xid, before = cursor.fetchone()
        write()
    with connection.cursor() as cursor:
        if inspectable:
            cursor.execute(
                "SELECT coalesce(sum(record_length - fpi_length), 0)"
                " FROM pg_get_wal_records_info(%s, pg_current_wal_flush_lsn())"
                " WHERE xid::text::bigint = %s",
                [before, xid],
            )
        else:
            cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", [before])
        (written,) = cursor.fetchone()
    return int(written)


@contextmanager
def round_trips(on: BaseDatabaseWrapper) -> Iterator[list[int]]:
    """The round trips Django's connection `on` makes inside, appended to the list yielded on
    the way out: the Syncs and simple Queries that libpq's trace of its psycopg connection
    shows it sending. Each is one wait for the server's answer: the statements of a pipeline
    (cursors.one_round_trip) share one Sync."""
    on.ensure_connection()
    made: list[int] = []
    with tempfile.TemporaryFile() as trace:
        on.connection.pgconn.trace(trace.fileno())
        on.connection.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield made
        finally:
            on.connection.pgconn.untrace()
        trace.seek(0)
        sent = [line.split("\t") for line in trace.read().decode().splitlines()]
    made.append(sum(1 for line in sent if line[0] == "F" and line[2] in ("Sync", "Query")))


def wait_until(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll `condition` until it is truthy and return its value; fail after `timeout` seconds.

    A state to reach, never a delay: the timeout only bounds a test that would hang.
    """
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


def without_ids(page: str) -> str:
    """A page without its todos' ids (plain or quoted in links): a random id may hold "9999"."""
    return re.sub(r"td_(?:5F)?[0-9a-f-]{36}", "", page)


def db_now() -> datetime:
    """The database clock, the one every transition reads."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        now: datetime = cursor.fetchone()[0]
    return now


# The `test.gate` handler and task (tests/worker_handlers.py, tests/tasks.py): they write a line
# to the gate's `started` file, then wait until its `gate` file exists.


def started_lines(gate: dict[str, str]) -> list[str]:
    path = Path(gate["started"])
    return path.read_text().splitlines() if path.exists() else []


def open_gate(gate: dict[str, str]) -> None:
    Path(gate["gate"]).touch()


# Child processes


def exists(pid: int) -> bool:
    """Whether `pid` names a process, a zombie included: one not reaped yet counts as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        return exists(pid)
    return state != "Z"


def read_until(stream: Any, text: str, timeout: float = 60) -> list[str]:
    """Read lines from a child's stream until one contains `text`; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"{text!r} not seen; got {lines!r}")


class OutputLines:
    """The lines a child process writes to `stream`, read on a thread as they come."""

    def __init__(self, stream: IO[str] | None) -> None:
        assert stream is not None, "the child's output is not a pipe"
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def said(self, text: str) -> str | None:
        """The first line so far that contains `text`."""
        return next((line for line in self.lines if text in line), None)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def join_reader(self, timeout: float) -> None:
        """Wait for the last lines of a child that ended."""
        self._reader.join(timeout)


# The SQS endpoint, live


def sqs_client(base: str, agent: Agent) -> Any:
    """A boto3 SQS client of `agent` for the server at `base`, each call sent once (botocore
    retries nothing) and read for up to 60 s (longer than a long poll)."""
    import boto3
    from botocore.config import Config

    from switchboard_todos.sqs.signing import secret_for

    return boto3.client(
        "sqs",
        endpoint_url=f"{base}/sqs/",
        region_name="us-east-1",
        aws_access_key_id=agent.name,
        aws_secret_access_key=secret_for(agent),
        config=Config(retries={"total_max_attempts": 1}, read_timeout=60),
    )


# The SQS endpoint, in process


def sqs_headers(agent: Agent, url: str, action: str, params: dict[str, Any]) -> dict[str, str]:
    """The headers boto3 sends with an action posted to `url`, signed with the agent's secret."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from switchboard_todos.sqs.signing import secret_for
    from switchboard_todos.sqs.views import CONTENT_TYPE

    request = AWSRequest(
        method="POST",
        url=url,
        data=json.dumps(params).encode(),
        headers={"Content-Type": CONTENT_TYPE, "X-Amz-Target": f"AmazonSQS.{action}"},
    )
    SigV4Auth(Credentials(agent.name, secret_for(agent)), "sqs", "us-east-1").add_auth(request)
    return {"Host": urlsplit(url).netloc, **dict(request.headers.items())}


def sqs_post(client: Client, agent: Agent, path: str, action: str, params: dict[str, Any]) -> Any:
    """An action posted to `path` through Django's test client, as boto3 posts it; its answer
    (asserted a success)."""
    from switchboard_todos.sqs.views import CONTENT_TYPE

    headers = sqs_headers(agent, f"http://testserver{path}", action, params)
    del headers["Content-Type"]  # the test client's content_type sends it
    response = client.post(path, json.dumps(params), content_type=CONTENT_TYPE, headers=headers)
    assert response.status_code == 200, response.content
    return json.loads(response.content)


def documented_transport_options() -> dict[str, Any]:
    """`broker_transport_options` of docs/celery.md's Celery project, as written there."""
    blocks = re.findall(
        r"```python\n(.*?)```",
        (Path(__file__).resolve().parent.parent / "docs" / "celery.md").read_text(),
        re.S,
    )
    settings: dict[str, Any] = {}
    exec(blocks[0], settings)  # noqa: S102 (the project's own documentation)
    return dict(settings["broker_transport_options"])
