"""Scenario 7: remote agents over HTTP, beside the in-process path they stand in for.

uvicorn serves the agents' API (the test settings' ASGI application, one process per CPU, each
with a pool of database connections, as docs/agents.md advises). Each agent is a process with
one keep-alive HTTP connection and a token of its own.

* Drain: 4 agents claim and complete one todo at a time over HTTP (two requests per todo,
  each authenticated), against 4 processes doing `claim_next` + `complete` in process.
* Long-poll pickup: one agent waits in `POST claim/` with `wait`; this process enqueues one
  todo at a time, and the latency runs from the enqueue's commit to the claim's answer, beside
  an in-process `claim_next(..., wait=)`. The clock is CLOCK_MONOTONIC, shared by every
  process on the machine.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import statistics
import time
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from bench import drain_single
from bench.harness import QUEUE, TTL, Bench, BenchError, Child, Row, Target, plural, reset
from bench.pickup import enqueue_ours

#: HTTP claim + complete should keep this share of the in-process single-op rate: on a machine
#: where the agents share the server's cores, with the token checked at every request.
TARGET = Target(ratio=0.4)
#: A todo enqueued during a long poll should be answered within this, in milliseconds.
PICKUP_TARGET = Target(below=50.0)
AGENTS = 4
#: How long one long poll waits before the agent asks again (and looks whether to stop).
WAIT = 1


class Agent:
    """One agent's keep-alive connection, through the standard library's client.

    Not httpx, as in the tests: its own cost per request (about a millisecond of CPU here)
    would be measured against the server, on the same CPUs.
    """

    def __init__(self, base: str, token: str) -> None:
        url = urlsplit(base)
        self._path = url.path
        self._connection = http.client.HTTPConnection(url.netloc, timeout=60)
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def call(self, method: str, path: str, body: Any = None) -> Any:
        payload = None if body is None else json.dumps(body)
        self._connection.request(method, self._path + path, payload, self._headers)
        response = self._connection.getresponse()
        answer = response.read()
        if response.status >= 400:
            raise BenchError(f"{method} {path}: {response.status} {answer.decode()}")
        return json.loads(answer)

    def close(self) -> None:
        self._connection.close()


def http_drain(child: Child, *, owner: str, base: str, tokens: dict[str, str]) -> int:
    """Claim and complete one todo at a time over HTTP, until the queue is empty."""
    done = 0
    agent = Agent(base, tokens[owner])
    agent.call("GET", "/todos/?limit=1")  # connected and authenticated before the clock starts
    child.start()
    while True:
        todos = agent.call("POST", "/claim/", {"queues": [QUEUE], "ttl": TTL})["todos"]
        if not todos:
            agent.close()
            return done
        agent.call("POST", f"/todos/{todos[0]['id']}/complete/", {})
        done += 1
        child.count()


def http_pickup(child: Child, *, base: str, token: str) -> dict[str, float]:
    """Long-poll for each todo; when each claim answered."""
    picked: dict[str, float] = {}
    agent = Agent(base, token)
    agent.call("GET", "/todos/?limit=1")
    child.start()
    while not child.stop.is_set():
        for todo in agent.call("POST", "/claim/", {"ttl": TTL, "wait": WAIT})["todos"]:
            picked[todo["id"]] = time.monotonic()
            agent.call("POST", f"/todos/{todo['id']}/complete/", {})
            child.count()
    agent.close()
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
    from tests.asgi import serve

    # One server process per CPU, as one would deploy it.
    env = {**os.environ, "DATABASE_POOL_SIZE": str(2 * AGENTS)}
    with serve(env, workers=os.cpu_count() or 1) as (base, _):
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
