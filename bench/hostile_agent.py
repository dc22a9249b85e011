"""Scenario 10: one hostile agent beside well-behaved ones, against the same run without it.

uvicorn serves the agents' API as in scenario 7 (one process per CPU), each process with a pool
of twice SWITCHBOARD_TODOS_AGENT_MAX_CONCURRENT connections, as docs/operating.md section 11
sizes it (a pool at or below that cap lets one token keep everyone else waiting for a
connection). The well-behaved agents (4, or one fewer than the pool has processes) claim and
complete one todo at a time over HTTP for 10 s, as in scenario 7 but each claim a long poll, as
an agent's loop does (a backlog answers it at once), and note how long each claim took (a 429
or 503 is waited out as its Retry-After says, within the claim's time). Each round runs them
once alone, and once beside each of the hostile agent's floods (bench/floods.py), in one more
process, under way a second before the clock starts:

* long polls only: 32 threads in `POST claim/` with `wait`, four times the long-poll cap;
* creates and fails: the same, failing at once (`retry_in` 0, a 64 KiB error) what they claim,
  beside 2 threads creating todos (1 KiB payloads, max_attempts 25) for them;
* the same with errors of 1 KiB, which the quota of bytes leaves uncounted;
* children on shared parents: creates whose `after` names the same 1,000 parents, a backlog of
  pending todos in the hostile agent's queue, again and again;
* refused plans: plans of 499 refused 409 by an idempotency key a todo it created first holds,
  and plans naming the 5,000 todos of that backlog and one that does not exist;
* concurrent creates: 120 at once from its one token, over and over.

The hostile agent has a token of its own that claims from and creates in queue `hostile`, with
the default quotas; each run starts with them unused, as for an agent quiet for a minute.
Where the server says 429, it waits the Retry-After it is given, and goes on: it works at its
quotas. Rate-limiting requests themselves is a reverse proxy's job, not the queue's. Every run
begins from an emptied, vacuumed table (`reset`): a run lasts seconds, so the server's
autovacuum (off on test servers) is not missed within it.

Figures, for each flood: the well-behaved agents' throughput with it over without (target: at
least 1 / 1.5), and their claims' p99 latency with it over without (target: at most 1.5). Each
run prints what the hostile agent's requests answered and the WAL the run wrote.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import Counter
from functools import partial
from typing import Any

from bench import floods
from bench.floods import HOSTILE, HOSTILE_QUEUE, Connection
from bench.harness import QUEUE, TTL, Bench, BenchError, Child, Row, Target, plural, reset
from bench.http_agents import make_tokens

#: The well-behaved agents' throughput and claim p99 with the flood, against without it.
THROUGHPUT_TARGET = Target(ratio=1 / 1.5)
LATENCY_TARGET = Target(at_most=1.5)
AGENTS = 4
#: How long the hostile agent is at work before the well-behaved agents' clock starts.
WARM_UP = 1.0
#: What a well-behaved agent waits out (as the Retry-After says) rather than stopping at.
RETRIED = (429, 503)


def answered(
    agent: Connection, child: Child, path: str, body: Any, refused: Counter[int]
) -> tuple[int, Any]:
    """POST `body` to `path` until the answer is neither 429 nor 503 (each waited out as its
    Retry-After says, and counted in `refused`), or the run is over."""
    while True:
        status, headers, answer = agent.call(path, body)
        if status not in RETRIED or child.stop.is_set():
            return status, answer
        refused[status] += 1
        child.stop.wait(float(headers.get("Retry-After", 1)))


def measured_drain(
    child: Child, *, owner: str, base: str, tokens: dict[str, str]
) -> tuple[int, list[float], Counter[int]]:
    """Claim (a long poll, as docs/agents.md's agent loop does) and complete one todo at a time
    until told to stop; how many were completed, each claim's latency in milliseconds, and the
    answers waited out, by status."""
    agent = Connection(base, tokens[owner])
    agent.call("/todos/?limit=1", None, "GET")  # connected and authenticated before the clock
    latencies: list[float] = []
    refused: Counter[int] = Counter()
    done = 0
    child.start()
    while not child.stop.is_set():
        started = time.perf_counter()
        body = {"queues": [QUEUE], "ttl": TTL, "wait": 1}
        status, answer = answered(agent, child, "/claim/", body, refused)
        latencies.append((time.perf_counter() - started) * 1000)
        if status in RETRIED:  # the run ended while it waited
            break
        if status != 200:
            raise BenchError(f"claim: {status} {answer}")
        if not answer["todos"]:
            raise BenchError("the backlog ran out before the run's end: make it larger")
        path = f"/todos/{answer['todos'][0]['id']}/complete/"
        status, answer = answered(agent, child, path, {}, refused)
        if status in RETRIED:
            break
        if status != 200:
            raise BenchError(f"complete: {status} {answer}")
        done += 1
        child.count()
    agent.close()
    return done, latencies, refused


def drain_or_flood(
    child: Child, *, owner: str, base: str, tokens: dict[str, str], flood: dict[str, Any]
) -> Any:
    """`measured_drain` for the well-behaved agents, the flood for the hostile one (the pool
    runs one task in every process of a run)."""
    if owner == HOSTILE:
        return floods.flood(child, base=base, token=tokens[HOSTILE], warm_up=WARM_UP, **flood)
    return measured_drain(child, owner=owner, base=base, tokens=tokens)


#: The runs of a round: the hostile agent's flood in each (None: no hostile agent). The first
#: two keep the rows' names of before the other floods were added.
RUNS: dict[str, str | None] = {
    "calm": None,
    "long polls": "long_polls",
    "long polls, creates, fails": "create_and_fail",
    "long polls, creates, fails of 1 KiB": "create_and_fail_small",
    "children on shared parents": "children",
    "refused plans": "refused_plans",
    "concurrent creates": "concurrent",
}


def wal() -> int:
    """Where the server's WAL is, in bytes."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        return int(cursor.fetchone()[0])


def drain(
    bench: Bench, agents: int, base: str, tokens: dict[str, str], name: str
) -> tuple[tuple[float, float], str]:
    """The well-behaved agents at work for a while (10 s; 2 s in smoke), with flood `RUNS[name]`
    beside them; their todos per second and their claims' p99 in ms, and the flood's note."""
    backlog = bench.size(full=10_000, smoke=1_000)
    reset(backlog)
    owners = [f"bench-{index}" for index in range(agents)]
    # The hostile long polls' wait is short, so that a run ends soon after its drain; a longer
    # one holds just as little.
    flood: dict[str, Any] = {}
    chosen = RUNS[name]
    if chosen is not None:
        owners.append(HOSTILE)
        flood = {"name": chosen, **floods.options(bench, chosen, bench.size(5, 1))}
    kwargs = [{"owner": owner, "base": base, "tokens": tokens, "flood": flood} for owner in owners]
    duration = bench.size(full=10.0, smoke=2.0)
    written = wal()
    seconds, results = bench.pool.run(drain_or_flood, kwargs, backlog, duration=duration)
    written = wal() - written
    done = sum(result[0] for result in results[:agents])
    latencies = [latency for result in results[:agents] for latency in result[1]]
    refused = sum((result[2] for result in results[:agents]), Counter[int]())
    p99 = statistics.quantiles(latencies, n=100)[98]
    said = f"{name}: {done / seconds:,.0f} todos/s, claim p99 {p99:.1f} ms; WAL "
    said += f"{written / 2**20:,.0f} MiB; the others waited out {dict(refused) or 'nothing'}"
    if flood:
        answers, used = results[-1]
        said += "; the hostile agent's answers: " + ", ".join(
            f"{what} x{count:,}" for what, count in sorted(answers.items())
        )
        said += f"; its own process used {used / seconds:.0%} of a CPU"
    print(f"  ({said})", flush=True)
    return (done / seconds, p99), floods.note(flood["name"], flood) if flood else ""


def run(bench: Bench) -> None:
    from switchboard_todos.agents import accounts
    from switchboard_todos.conf import conf
    from switchboard_todos.models import Agent

    agents = max(1, min(AGENTS, bench.pool.size - 1))
    tokens = make_tokens([f"bench-{index}" for index in range(agents)])
    Agent.objects.filter(name=HOSTILE).delete()
    tokens[HOSTILE] = accounts.create_agent(
        HOSTILE, claim_queues=[HOSTILE_QUEUE], create_queues=[HOSTILE_QUEUE]
    )[1]
    from tests.asgi import serve

    env = {**os.environ, "DATABASE_POOL_SIZE": str(2 * conf.AGENT_MAX_CONCURRENT)}
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in RUNS}
    notes: dict[str, str] = {}
    with serve(env, workers=os.cpu_count() or 1) as (base, _):

        def side(name: str) -> float:
            measured, notes[name] = drain(bench, agents, base, tokens, name)
            figures[name].append(measured)
            return 0.0

        bench.interleave({name: partial(side, name) for name in RUNS})
    calm = figures.pop("calm")
    # Each run's two figures: the throughput, and the claims' p99, against the calm run's.
    rows = [
        (f"{plural(agents, 'agent')} claim + complete", "todos/s", THROUGHPUT_TARGET),
        ("claim p99", "ms", LATENCY_TARGET),
    ]
    for name, flooded in figures.items():
        for index, (what, unit, target) in enumerate(rows):
            bench.add(
                Row(
                    f"hostile agent ({name}): {what}",
                    [run[index] for run in flooded],
                    [run[index] for run in calm],
                    "without it",
                    unit=unit,
                    target=target,
                    note=notes[name],
                )
            )
