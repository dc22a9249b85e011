"""Scenario 7: remote agents over HTTP, beside the in-process path they stand in for.

A uvicorn process serves the agents' API (the test settings' ASGI application, with a pool of
database connections, as docs/agents.md advises). Each agent is a process with one keep-alive
HTTP connection and a token of its own.

* Drain: 4 agents claim and complete one todo at a time over HTTP (two requests per todo,
  each authenticated), against 4 processes doing `claim_next` + `complete` in process.
* Long-poll pickup: one agent waits in `POST claim/` with `wait`; this process enqueues one
  todo at a time, and the latency runs from the enqueue's commit to the claim's answer, beside
  an in-process `claim_next(..., wait=)`. The clock is CLOCK_MONOTONIC, shared by every
  process on the machine.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from bench import drain_single
from bench.harness import QUEUE, TTL, Bench, BenchError, Child, Row, Target, plural, reset
from bench.pickup import enqueue_ours

#: HTTP claim + complete should keep this share of the in-process single-op rate.
TARGET = Target(ratio=0.5)
#: A todo enqueued during a long poll should be answered within this, in milliseconds.
PICKUP_TARGET = Target(below=50.0)
AGENTS = 4
PORT = 8765
#: How long one long poll waits before the agent asks again (and looks whether to stop).
WAIT = 1


def client(base: str, token: str) -> Any:
    import httpx

    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def http_drain(child: Child, *, owner: str, base: str, tokens: dict[str, str]) -> int:
    """Claim and complete one todo at a time over HTTP, until the queue is empty."""
    done = 0
    with client(base, tokens[owner]) as agent:
        agent.get("/todos/", params={"limit": 1}).raise_for_status()  # connected, authenticated
        child.start()
        while True:
            claimed = agent.post("/claim/", json={"queues": [QUEUE], "ttl": TTL})
            todos = claimed.raise_for_status().json()["todos"]
            if not todos:
                return done
            agent.post(f"/todos/{todos[0]['id']}/complete/", json={}).raise_for_status()
            done += 1
            child.count()


def http_pickup(child: Child, *, base: str, token: str) -> dict[str, float]:
    """Long-poll for each todo; when each claim answered."""
    picked: dict[str, float] = {}
    with client(base, token) as agent:
        agent.get("/todos/", params={"limit": 1}).raise_for_status()
        child.start()
        while not child.stop.is_set():
            answer = agent.post("/claim/", json={"ttl": TTL, "wait": WAIT}).raise_for_status()
            for todo in answer.json()["todos"]:
                picked[todo["id"]] = time.monotonic()
                agent.post(f"/todos/{todo['id']}/complete/", json={}).raise_for_status()
                child.count()
    return picked


def in_process_pickup(child: Child) -> dict[str, float]:
    """The same, through `claim_next(..., wait=)` in process."""
    from switchboard_todos.models import Todo

    picked: dict[str, float] = {}
    child.start()
    while not child.stop.is_set():
        todo = Todo.objects.claim_next(QUEUE, "bench-pickup", TTL, wait=WAIT)
        if todo is not None:
            picked[todo.id] = time.monotonic()
            Todo.objects.complete(todo.id, "bench-pickup")
            child.count()
    return picked


@contextmanager
def server() -> Iterator[str]:
    """uvicorn serving the API on the benchmark database; its base URL once it answers."""
    import httpx

    env = {**os.environ, "DATABASE_POOL_SIZE": str(2 * AGENTS)}
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tests.asgi:application", "--port", str(PORT),
         "--no-access-log", "--log-level", "warning"],
        env=env,
    )  # fmt: skip
    base = f"http://127.0.0.1:{PORT}/api"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/openapi.json").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise BenchError("uvicorn did not start")
            time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        process.wait(30)


def make_tokens(names: list[str]) -> dict[str, str]:
    """A fresh agent, claiming from the benchmark's queue, for each name."""
    from switchboard_todos.agents import accounts
    from switchboard_todos.models import Agent

    Agent.objects.filter(name__in=names).delete()
    return {name: accounts.create_agent(name, claim_queues=[QUEUE])[1] for name in names}


def pickup_latencies(
    bench: Bench, task: Any, kwargs: dict[str, Any], gaps: list[float]
) -> list[float]:
    """Enqueue one todo per gap while `task` long-polls; each one's latency in milliseconds."""
    reset()
    enqueued: dict[str, float] = {}
    during = partial(enqueue_ours, bench.size(full=0.5, smoke=0.2), gaps, enqueued)
    _, (picked,) = bench.pool.run(task, [kwargs], len(gaps), during=during)
    return [(picked[todo_id] - at) * 1000 for todo_id, at in enqueued.items()]


def run(bench: Bench) -> None:
    agents = min(AGENTS, bench.pool.size)
    backlog = bench.size(full=4000, smoke=60)
    tokens = make_tokens([f"bench-{index}" for index in range(agents)] + ["bench-pickup"])
    with server() as base:
        figures = bench.interleave(
            {
                "http": partial(bench.drain, http_drain, agents, backlog, base=base, tokens=tokens),
                "in-process": partial(bench.drain, drain_single.ours, agents, backlog),
            }
        )
        bench.add(
            Row(
                f"HTTP agents, claim + complete, {plural(agents, 'agent')}",
                figures["http"],
                figures["in-process"],
                "in-process claim_next + complete",
                target=TARGET,
                note="keep-alive connections, a token each",
            )
        )
        # Gaps longer than an HTTP claim-and-complete cycle: the wake-up is measured, not a queue.
        count = bench.size(full=40, smoke=5)
        rng = random.Random(7)
        gaps = [rng.uniform(0.1, 0.3) for _ in range(count)]
        rounds: dict[str, list[list[float]]] = {"http": [], "in-process": []}
        sides = {
            "http": (http_pickup, {"base": base, "token": tokens["bench-pickup"]}),
            "in-process": (in_process_pickup, {}),
        }

        def side(name: str) -> float:
            task, kwargs = sides[name]
            rounds[name].append(pickup_latencies(bench, task, kwargs, gaps))
            return 0.0

        bench.interleave({name: partial(side, name) for name in rounds})
    bench.add(
        Row(
            "HTTP long-poll pickup latency median",
            [statistics.median(samples) for samples in rounds["http"]],
            [statistics.median(samples) for samples in rounds["in-process"]],
            "in-process claim_next(wait=)",
            unit="ms",
            target=PICKUP_TARGET,
            note=f"{count} todos a round, 100-300 ms apart",
        )
    )
