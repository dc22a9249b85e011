"""The hostile agent's floods (scenario 10, bench/hostile_agent.py): what one valid token does,
at its quotas, beside the well-behaved agents.

Each flood is a set of threads in the hostile agent's process, each on a keep-alive connection
of its own, sending the same request over and over. Where the server says 429, the thread waits
the Retry-After it is given and goes on: the agent works at its quotas (the long-poll cap, the
cap on requests in flight, the creations and the bytes a minute). A flood ends with the run, or
at MAX_REQUESTS requests, or MAX_SECONDS after it began, whichever comes first.

* `long_polls`: FLOOD threads in `POST claim/` with `wait`, over and over, failing at once
  (`retry_in` 0, a 64 KiB error) whatever they claim;
* `create_and_fail`: the same, and CREATORS threads creating todos (1 KiB payloads, the highest
  max_attempts its quota allows) for the long polls to claim and fail until their attempts are
  used up;
* `create_and_fail_small`: the same with errors of SMALL_ERROR_BYTES, of which the default
  quota of bytes (16 MiB a minute) would let 16,000 through a minute: the quota of fails (600 a
  minute) is what holds them;
* `children`: CHILD_CREATORS threads creating todos whose `after` names the same parents (as
  many as the API allows, MAX_PARENTS) again and again: a producer's backlog of pending todos
  in the hostile agent's queue, which it may see (and which it could not create itself, at 600
  a minute);
* `refused_plans`: plans refused whole. One thread sends a plan of PLAN todos (refs, each
  waiting for the one before) whose first todo's idempotency key a todo it created first
  holds (409); PLAN_CREATORS threads send plans naming every parent of the backlog and one id
  no todo has (refused as a parent it may not see);
* `concurrent`: CONCURRENT threads creating todos at once, from the one token.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from bench.harness import TTL, Bench, Child, settle

HOSTILE = "bench-hostile"
HOSTILE_QUEUE = "hostile"
#: The hostile agent's long-polling threads: four times what the long-poll cap
#: (SWITCHBOARD_TODOS_AGENT_MAX_WAITS) admits per server process.
FLOOD = 32
#: Threads creating todos for the long polls to fail (`create_and_fail`).
CREATORS = 2
#: Threads creating children of the shared parents; their creates queue on the agent's row.
CHILD_CREATORS = 4
#: Threads sending plans that name a missing parent.
PLAN_CREATORS = 4
#: The size of a hostile error: the most SWITCHBOARD_TODOS_MAX_ERROR_BYTES keeps.
ERROR_BYTES = 64 * 1024
#: The size of a small hostile error.
SMALL_ERROR_BYTES = 1024
#: The most todos one `after` names (validation.MAX_PARENTS).
MAX_PARENTS = 1000
#: The idempotency key that refuses the plans (409).
HELD_KEY = "held"
#: The bounds of a flood: requests in all, and seconds from its start.
MAX_REQUESTS = 200_000
MAX_SECONDS = 120.0

Loop = Callable[[], None]


class Connection:
    """One keep-alive HTTP connection with a token; answers (status, headers, JSON)."""

    def __init__(self, base: str, token: str) -> None:
        url = urlsplit(base)
        if url.hostname != "127.0.0.1":
            raise ValueError(f"the benchmark's traffic stays on 127.0.0.1, not {url.hostname}")
        self._path = url.path
        self._connection = http.client.HTTPConnection(url.netloc, timeout=120)
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def call(self, path: str, body: Any, method: str = "POST") -> tuple[int, Any, Any]:
        """The answer to one request; sent again on a new connection when the server had
        closed this one (uvicorn closes one idle for 5 s, as after a long Retry-After)."""
        payload = None if body is None else json.dumps(body)
        try:
            return self._send(method, path, payload)
        except ConnectionError:
            self._connection.close()
            return self._send(method, path, payload)

    def _send(self, method: str, path: str, payload: str | None) -> tuple[int, Any, Any]:
        self._connection.request(method, self._path + path, payload, self._headers)
        response = self._connection.getresponse()
        answer = response.read()
        return response.status, response.headers, json.loads(answer) if answer else None

    def close(self) -> None:
        self._connection.close()


class Flood:
    """The threads of one flood: their connections, bounds, and answers by request and status."""

    def __init__(self, child: Child, base: str, token: str) -> None:
        self.child = child
        self._base = base
        self._token = token
        self.answers: dict[str, int] = {}
        self._lock = threading.Lock()
        self._sent = 0
        self._deadline = time.monotonic() + MAX_SECONDS

    def connect(self) -> Connection:
        return Connection(self._base, self._token)

    def going(self) -> bool:
        """Whether to send one more request: the run goes on, within the flood's bounds."""
        with self._lock:
            self._sent += 1
            within = self._sent <= MAX_REQUESTS and time.monotonic() < self._deadline
        return within and not self.child.stop.is_set()

    def send(self, agent: Connection, what: str, path: str, body: Any) -> tuple[int, Any]:
        """POST `body`, note its answer, and after a 429 wait its Retry-After (or the run's end)."""
        status, headers, answer = agent.call(path, body)
        with self._lock:
            key = f"{what} {status}"
            self.answers[key] = self.answers.get(key, 0) + 1
        if status == 429:
            self.child.stop.wait(float(headers.get("Retry-After", 1)))
        return status, answer

    def repeat(self, what: str, path: str, body: Any) -> Loop:
        """A thread's loop: `body` to `path` over and over, on a connection of its own."""

        def loop() -> None:
            agent = self.connect()
            while self.going():
                self.send(agent, what, path, body)
            agent.close()

        return loop


def junk(**fields: Any) -> dict[str, Any]:
    """A todo the hostile agent creates in its queue."""
    return {"queue": HOSTILE_QUEUE, "kind": "junk", **fields}


def long_polls(
    flood: Flood, *, wait: float, creators: int = 0, error_bytes: int = ERROR_BYTES, **_: Any
) -> list[Loop]:
    error = "x" * error_bytes

    def poll() -> None:
        agent = flood.connect()
        while flood.going():
            status, answer = flood.send(
                agent, "long poll", "/claim/", {"ttl": TTL, "wait": wait, "limit": 10}
            )
            for todo in answer["todos"] if status == 200 else []:
                if not flood.going():
                    break
                body = {"error": error, "retry_in": 0}
                flood.send(agent, "fail", f"/todos/{todo['id']}/fail/", body)
        agent.close()

    create = flood.repeat("create", "/todos/", junk(payload={"junk": "y" * 1024}, max_attempts=25))
    return [poll] * FLOOD + [create] * creators


def create_and_fail(flood: Flood, **options: Any) -> list[Loop]:
    return long_polls(flood, creators=CREATORS, **options)


def create_and_fail_small(flood: Flood, **options: Any) -> list[Loop]:
    return long_polls(flood, creators=CREATORS, error_bytes=SMALL_ERROR_BYTES, **options)


def children(flood: Flood, *, parents: list[str], **_: Any) -> list[Loop]:
    return [flood.repeat("child", "/todos/", junk(after=parents[:MAX_PARENTS]))] * CHILD_CREATORS


def refused_plans(flood: Flood, *, parents: list[str], plan: int, **_: Any) -> list[Loop]:
    holder = flood.connect()
    flood.send(holder, "key holder", "/todos/", junk(idempotency_key=HELD_KEY))
    holder.close()
    held = [junk(ref="t0", idempotency_key=HELD_KEY)]
    held += [junk(ref=f"t{n}", after=[f"t{n - 1}"]) for n in range(1, plan)]
    named = [*parents, "td_no-such-todo"]
    missing = [junk(after=named[n : n + MAX_PARENTS]) for n in range(0, len(named), MAX_PARENTS)]
    return [flood.repeat("plan, key held", "/todos/batch/", {"todos": held})] + [
        flood.repeat("plan, parent missing", "/todos/batch/", {"todos": missing})
    ] * PLAN_CREATORS


def concurrent(flood: Flood, *, concurrency: int, **_: Any) -> list[Loop]:
    return [flood.repeat("create", "/todos/", junk())] * concurrency


#: Each flood by name: its threads' loops, given the options `options()` made for it.
FLOODS: dict[str, Callable[..., list[Loop]]] = {
    "long_polls": long_polls,
    "create_and_fail": create_and_fail,
    "create_and_fail_small": create_and_fail_small,
    "children": children,
    "refused_plans": refused_plans,
    "concurrent": concurrent,
}
#: The floods that name a backlog of parents.
WITH_PARENTS = {"children", "refused_plans"}
#: What each flood is, for its rows' note.
NOTES = {
    "long_polls": f"{FLOOD} long polls",
    "create_and_fail": f"{FLOOD} long polls failing what they claim, {CREATORS} creators",
    "create_and_fail_small": f"the same, errors of {SMALL_ERROR_BYTES} bytes",
    "children": f"{CHILD_CREATORS} creators, `after` naming the same {{parents}} parents",
    "refused_plans": "plans of {plan} refused by a held key; "
    f"{PLAN_CREATORS} threads' plans naming {{named}} parents, one missing",
    "concurrent": "{concurrency} concurrent creates",
}


def options(bench: Bench, name: str, wait: float) -> dict[str, Any]:
    """Before a run of flood `name` (after the table's reset): the hostile agent's paced quotas
    paid up (its whole burst), as for an agent quiet for a minute (each run starts alike,
    whatever the run before it used), and the backlog of parents when the flood names one;
    the options of the flood's threads."""
    from django.db import connection

    from switchboard_todos.models import Agent

    Agent.objects.filter(name=HOSTILE).update(
        creates_paid_until=None, bytes_paid_until=None, fails_paid_until=None
    )
    chosen: dict[str, Any] = {
        "wait": wait,
        "plan": bench.size(full=499, smoke=50),
        "concurrency": bench.size(full=120, smoke=24),
        "parents": [],
    }
    if name in WITH_PARENTS:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO todos (queue, kind) SELECT %s, 'bench.parent' "
                "FROM generate_series(1, %s) RETURNING id",
                [HOSTILE_QUEUE, bench.size(full=5000, smoke=200)],
            )
            chosen["parents"] = [row[0] for row in cursor.fetchall()]
        settle()
    return chosen


def note(name: str, chosen: dict[str, Any]) -> str:
    parents = chosen["parents"]
    return NOTES[name].format(
        **{**chosen, "parents": min(len(parents), MAX_PARENTS), "named": len(parents) + 1}
    )


def flood(child: Child, *, base: str, token: str, name: str, warm_up: float, **chosen: Any) -> Any:
    """Run flood `name` until the well-behaved agents are done, under way `warm_up` seconds
    before their clock starts; how many requests ended how, and the CPU seconds the flood's own
    process used while the clock ran (on this machine the clients share the server's CPUs)."""
    flooding = Flood(child, base, token)
    threads = [
        threading.Thread(target=target, daemon=True) for target in FLOODS[name](flooding, **chosen)
    ]
    for thread in threads:
        thread.start()
    time.sleep(warm_up)  # under way before the clock starts: the flood, not its first second
    child.start()
    used = time.process_time()
    child.stop.wait()
    used = time.process_time() - used
    # Each request ends soon after the run (a long poll with its wait, at the latest): none is
    # left to a later run.
    for thread in threads:
        thread.join(chosen["wait"] + 30)
    return flooding.answers, used
