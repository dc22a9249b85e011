"""Scenario 10: Celery and dramatiq, unmodified, over the SQS endpoint against the same
clients over moto's SQS in server mode (an in-memory SQS stand-in), on this machine, in the
same run.

uvicorn serves the endpoint (one process per CPU, as in sqs_agents), moto one threaded
process. Each has a Celery worker (`--pool threads`, 4 threads) and a dramatiq worker (1
process, 4 threads), started once and warmed up with a task. A run sends its tasks with
`.delay()` (dramatiq: `.send()`) from this process and lasts until the workers have run every
one of them: tasks per second, end to end, sending included.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from bench.client_tasks import CELERY_QUEUE, DRAMATIQ_QUEUE, celery_tick, dramatiq_tick
from bench.harness import Bench, BenchError, Row, Target, reset

CLIENTS = ("Celery", "dramatiq")
THREADS = 4
#: The longest a run, a warm-up or a server's start may take.
TIMEOUT = 120
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Side:
    """One SQS server, a worker of each client on it, and a producer of each here."""

    name: str
    celery_url: str
    endpoint_url: str
    credentials: tuple[str, str]
    runs: Path
    before_run: Callable[[], None] = lambda: None
    senders: dict[str, Callable[[], Any]] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """Where the workers connect, as their users' settings would say."""
        return {
            "CELERY_BROKER_URL": self.celery_url,
            "SQS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.credentials[0],
            "AWS_SECRET_ACCESS_KEY": self.credentials[1],
        }

    def runs_of(self, client: str) -> Path:
        return self.runs / f"{self.name}-{client}"

    def log_of(self, client: str) -> Path:
        return self.runs / f"{self.name}-{client}.log"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """moto's server mode in a process of its own; its URL once it answers."""
    import httpx

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait(lambda: _answers(httpx, url) or process.poll() is not None, "moto to answer")
        if process.poll() is not None:
            raise BenchError("moto's server did not start")
        yield url
    finally:
        process.terminate()
        process.wait(30)


def _answers(httpx: Any, url: str) -> bool:
    try:
        httpx.get(url)
    except httpx.TransportError:
        return False
    return True


def wait(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {what}")
        time.sleep(0.002)


@contextlib.contextmanager
def workers(*sides: Side) -> Iterator[None]:
    """A Celery and a dramatiq worker on each side's server, all started at once, each
    warmed up with one task."""
    commands = {
        "Celery": [
            "celery", "--app", "bench.client_tasks:celery", "worker", "--pool", "threads",
            "--concurrency", str(THREADS), "--loglevel", "WARNING", "--queues", CELERY_QUEUE,
        ],
        "dramatiq": [
            "dramatiq", "bench.client_tasks:broker", "--processes", "1",
            "--threads", str(THREADS),
        ],
    }  # fmt: skip
    started = []
    try:
        for side in sides:
            side.senders = {
                "Celery": celery_tick(side.celery_url).delay,
                "dramatiq": dramatiq_tick(side.endpoint_url, *side.credentials).send,
            }
            for client, command in commands.items():
                with side.log_of(client).open("w") as log:
                    started.append(
                        subprocess.Popen(
                            [sys.executable, "-m", *command],
                            cwd=ROOT,
                            env={**os.environ, **side.env, "BENCH_RUNS": str(side.runs_of(client))},
                            stdout=log,
                            stderr=subprocess.STDOUT,
                        )
                    )
        for side in sides:
            for client in CLIENTS:
                send(side, client, 1)
        yield
    finally:
        stop(started)


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """Ask `processes` to stop, all at once; kill those still running after 30 s."""
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def send(side: Side, client: str, count: int) -> float:
    """Send `count` tasks of `client` and wait until they have all run; tasks per second."""
    runs = side.runs_of(client)
    runs.write_bytes(b"")
    side.before_run()
    sender = side.senders[client]
    started = time.monotonic()
    for _ in range(count):
        sender()
    try:
        wait(lambda: runs.stat().st_size >= 2 * count, f"{count} {client} tasks on {side.name}")
    except BenchError as error:
        raise BenchError(f"{error}; its worker said:\n{side.log_of(client).read_text()}") from None
    seconds = time.monotonic() - started
    if runs.stat().st_size != 2 * count:
        raise BenchError(f"{client} on {side.name}: a task ran more than once")
    return count / seconds


def make_agent(name: str) -> str:
    """A fresh agent granted both clients' queues, with room for a benchmark's rate (a Celery
    project's producers and workers need it too: docs/celery.md); its SQS secret."""
    from switchboard_todos.agents import accounts
    from switchboard_todos.models import Agent
    from switchboard_todos.sqs.signing import secret_for

    Agent.objects.filter(name=name).delete()
    queues = [CELERY_QUEUE, DRAMATIQ_QUEUE]
    agent = accounts.create_agent(name, claim_queues=queues, create_queues=queues)[0]
    Agent.objects.filter(pk=agent.pk).update(max_held=1000, max_creates_per_minute=1_000_000)
    return secret_for(agent)


def run(bench: Bench) -> None:
    from tests.asgi import serve

    name = "bench-clients"
    credentials = (name, make_agent(name))
    count = bench.size(full=2000, smoke=20)
    env = {**os.environ, "DATABASE_POOL_SIZE": "8"}
    with (
        tempfile.TemporaryDirectory() as runs,
        serve(env, workers=os.cpu_count() or 1) as (api, _),
        moto_server() as moto,
    ):
        base = api.removesuffix("/api")
        ours = Side(
            "endpoint",
            f"sqs://{name}:{credentials[1]}@{base.removeprefix('http://')}",
            f"{base}/sqs/",
            credentials,
            Path(runs),
            before_run=reset,
        )
        theirs = Side(
            "moto",
            f"sqs://bench:bench@{moto.removeprefix('http://')}",
            moto,
            ("bench", "bench"),
            Path(runs),
        )
        with workers(ours, theirs):
            for client in CLIENTS:
                figures = bench.interleave(
                    {
                        "ours": partial(send, ours, client, count),
                        "moto": partial(send, theirs, client, count),
                    }
                )
                bench.add(
                    Row(
                        f"{client} tasks over SQS, 1 worker of {THREADS} threads",
                        figures["ours"],
                        figures["moto"],
                        "over moto's server (in-memory SQS)",
                        unit="tasks/s",
                        target=Target(ratio=0.8),
                        note="sent from one process, counted when run",
                    )
                )
