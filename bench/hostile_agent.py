"""Scenario 10: one hostile agent beside well-behaved ones, against the same run without it.

uvicorn serves the agents' API as in scenario 7 (one process per CPU, a pool of connections
each). The well-behaved agents (4, or one fewer than the pool has processes) claim and complete
one todo at a time over HTTP for 10 s, as in scenario 7 but each claim a long poll, as an
agent's loop does (a backlog answers it at once), and note how long each claim took. Each
round does so three times: without the hostile agent, with its long polls only, and with
everything it does, in one more process, under way a second before the clock starts. The
hostile agent has a token of its own that claims from and creates in queue `hostile`, and

* floods long polls: FLOOD threads, each in `POST claim/` with `wait` over and over, four
  times what the long-poll cap (SWITCHBOARD_TODOS_AGENT_MAX_WAITS) admits per server process;
* creates todos as fast as it can (1 KiB payloads, the highest max_attempts its quota allows);
* fails every todo its long polls claim, at once (`retry_in` 0, a 64 KiB error), so that each
  comes back until its attempts are used up.

Where the server says 429 it waits the Retry-After it is given, and goes on: it works at its
quotas. Today those are the long-poll cap; the creates and fails run unbounded until the
quotas of issue 24 §2 (todos created per minute, the highest max_attempts, the size of an error)
are in, and apply to these same requests then. Rate-limiting requests themselves is a reverse
proxy's job, not the queue's.

Figures, for each hostile run: the well-behaved agents' throughput with it over without
(target: at least 1 / 1.5), and their claims' p99 latency with it over without (target: at
most 1.5).
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import threading
import time
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from bench.harness import QUEUE, TTL, Bench, BenchError, Child, Row, Target, plural, reset
from bench.http_agents import make_tokens

#: The well-behaved agents' throughput and claim p99 with the flood, against without it.
THROUGHPUT_TARGET = Target(ratio=1 / 1.5)
LATENCY_TARGET = Target(at_most=1.5)
AGENTS = 4
HOSTILE = "bench-hostile"
HOSTILE_QUEUE = "hostile"
#: The hostile agent's long-polling threads.
FLOOD = 32
#: How long the hostile agent is at work before the well-behaved agents' clock starts.
WARM_UP = 1.0
#: The size of a hostile error: the most SWITCHBOARD_TODOS_MAX_ERROR_BYTES keeps.
ERROR_BYTES = 64 * 1024


class Connection:
    """One keep-alive HTTP connection with a token; answers (status, headers, JSON)."""

    def __init__(self, base: str, token: str) -> None:
        url = urlsplit(base)
        self._path = url.path
        self._connection = http.client.HTTPConnection(url.netloc, timeout=120)
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def call(self, path: str, body: Any, method: str = "POST") -> tuple[int, Any, Any]:
        payload = None if body is None else json.dumps(body)
        self._connection.request(method, self._path + path, payload, self._headers)
        response = self._connection.getresponse()
        answer = response.read()
        return response.status, response.headers, json.loads(answer) if answer else None

    def close(self) -> None:
        self._connection.close()


def measured_drain(
    child: Child, *, owner: str, base: str, tokens: dict[str, str]
) -> tuple[int, list[float]]:
    """Claim (a long poll, as docs/agents.md's agent loop does) and complete one todo at a time
    until told to stop; how many were completed, and each claim's latency in milliseconds."""
    agent = Connection(base, tokens[owner])
    agent.call("/todos/?limit=1", None, "GET")  # connected and authenticated before the clock
    latencies: list[float] = []
    done = 0
    child.start()
    while not child.stop.is_set():
        started = time.perf_counter()
        status, _, answer = agent.call("/claim/", {"queues": [QUEUE], "ttl": TTL, "wait": 1})
        latencies.append((time.perf_counter() - started) * 1000)
        if status != 200:
            raise BenchError(f"claim: {status} {answer}")
        if not answer["todos"]:
            raise BenchError("the backlog ran out before the run's end: make it larger")
        status, _, answer = agent.call(f"/todos/{answer['todos'][0]['id']}/complete/", {})
        if status != 200:
            raise BenchError(f"complete: {status} {answer}")
        done += 1
        child.count()
    agent.close()
    return done, latencies


def hostile(child: Child, *, base: str, token: str, creators: int, wait: float) -> dict[str, int]:
    """Flood long polls of `wait` seconds, and with `creators` create and fail, until the
    well-behaved agents are done; how many requests ended how."""
    answers: dict[str, int] = {}
    lock = threading.Lock()
    error = "x" * ERROR_BYTES

    def note(what: str, status: int, headers: Any) -> None:
        with lock:
            key = f"{what} {status}"
            answers[key] = answers.get(key, 0) + 1
        if status == 429:
            child.stop.wait(float(headers.get("Retry-After", 1)))

    def poll() -> None:
        agent = Connection(base, token)
        while not child.stop.is_set():
            status, headers, answer = agent.call("/claim/", {"ttl": TTL, "wait": wait, "limit": 10})
            note("long poll", status, headers)
            for todo in answer.get("todos", []) if status == 200 else []:
                body = {"error": error, "retry_in": 0}
                note("fail", *agent.call(f"/todos/{todo['id']}/fail/", body)[:2])
        agent.close()

    def create() -> None:
        agent = Connection(base, token)
        payload = {"junk": "y" * 1024}
        body = {"queue": HOSTILE_QUEUE, "kind": "junk", "payload": payload, "max_attempts": 25}
        while not child.stop.is_set():
            note("create", *agent.call("/todos/", body)[:2])
        agent.close()

    threads = [threading.Thread(target=poll, daemon=True) for _ in range(FLOOD)]
    threads += [threading.Thread(target=create, daemon=True) for _ in range(creators)]
    for thread in threads:
        thread.start()
    time.sleep(WARM_UP)  # under way before the clock starts: the flood, not its first second
    child.start()
    child.stop.wait()
    # The long polls end with their wait, at the latest: none is left to a later run.
    for thread in threads:
        thread.join(wait + 30)
    return answers


def drain_or_flood(
    child: Child, *, owner: str, base: str, tokens: dict[str, str], creators: int, wait: float
) -> Any:
    """`measured_drain` for the well-behaved agents, `hostile` for the hostile one (the pool
    runs one task in every process of a run)."""
    if owner == HOSTILE:
        return hostile(child, base=base, token=tokens[HOSTILE], creators=creators, wait=wait)
    return measured_drain(child, owner=owner, base=base, tokens=tokens)


#: The runs of a round: without the hostile agent, with its long polls only, with everything;
#: the hostile agent's creator threads in each (None: no hostile agent).
RUNS: dict[str, int | None] = {"calm": None, "long polls": 0, "long polls, creates, fails": 2}


def drain(
    bench: Bench, agents: int, base: str, tokens: dict[str, str], creators: int | None
) -> tuple[float, float]:
    """The well-behaved agents at work for a while (10 s; 2 s in smoke), the hostile one beside
    them unless `creators` is None; their todos per second, and their claims' p99 in ms."""
    backlog = bench.size(full=10_000, smoke=1_000)
    reset(backlog)
    owners = [f"bench-{index}" for index in range(agents)]
    if creators is not None:
        owners.append(HOSTILE)
    # The hostile long polls' wait is short, so that a run ends soon after its drain; a longer
    # one holds just as little.
    wait = bench.size(full=5, smoke=1)
    kwargs = [
        {"owner": owner, "base": base, "tokens": tokens, "creators": creators or 0, "wait": wait}
        for owner in owners
    ]
    duration = bench.size(full=10.0, smoke=2.0)
    seconds, results = bench.pool.run(drain_or_flood, kwargs, backlog, duration=duration)
    done = sum(result[0] for result in results[:agents])
    latencies = [latency for result in results[:agents] for latency in result[1]]
    return done / seconds, statistics.quantiles(latencies, n=100)[98]


def run(bench: Bench) -> None:
    from switchboard_todos.agents import accounts
    from switchboard_todos.models import Agent

    agents = max(1, min(AGENTS, bench.pool.size - 1))
    tokens = make_tokens([f"bench-{index}" for index in range(agents)])
    Agent.objects.filter(name=HOSTILE).delete()
    tokens[HOSTILE] = accounts.create_agent(
        HOSTILE, claim_queues=[HOSTILE_QUEUE], create_queues=[HOSTILE_QUEUE]
    )[1]
    from tests.asgi import serve

    env = {**os.environ, "DATABASE_POOL_SIZE": str(2 * AGENTS)}
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in RUNS}
    with serve(env, workers=os.cpu_count() or 1) as (base, _):

        def side(name: str) -> float:
            figures[name].append(drain(bench, agents, base, tokens, RUNS[name]))
            return 0.0

        bench.interleave({name: partial(side, name) for name in RUNS})
    calm = figures.pop("calm")
    # Each run's two figures: the throughput, and the claims' p99, against the calm run's.
    rows = [
        (f"{plural(agents, 'agent')} claim + complete", "todos/s", THROUGHPUT_TARGET),
        ("claim p99", "ms", LATENCY_TARGET),
    ]
    for name, flooded in figures.items():
        note = f"{FLOOD} hostile long polls" + (f", {RUNS[name]} creators" if RUNS[name] else "")
        for index, (what, unit, target) in enumerate(rows):
            bench.add(
                Row(
                    f"hostile agent ({name}): {what}",
                    [run[index] for run in flooded],
                    [run[index] for run in calm],
                    "without it",
                    unit=unit,
                    target=target,
                    note=note,
                )
            )
