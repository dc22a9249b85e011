"""An agent's quotas: the todos it may hold at once, the todos it may create a minute, the
bytes of JSON it may write a minute, the todos it may fail or release a minute, and the
attempts a todo it creates may have. Each is its Agent field, else the project's setting.

The quotas a minute are paced: at most `burst_seconds`' worth of a minute's quota at once,
refilled continuously, so that a hostile agent cannot spend its minute in the first second.
A claim past `max_held`, and a write past `max_creates_per_minute`, `max_bytes_per_minute` or
`max_fails_per_minute`, are Throttled, with the time until there is room again; a
`max_attempts` above the limit is InvalidTodo, as waiting would never make it acceptable.
"""

from __future__ import annotations

import threading
import time

from django.db import connections, router

from switchboard_todos import cursors, validation
from switchboard_todos.conf import conf
from switchboard_todos.exceptions import InvalidTodo, NotAuthenticated, Throttled
from switchboard_todos.models import Agent
from switchboard_todos.sql import agent_queries
from switchboard_todos.transitions import DEFAULT_MAX_ATTEMPTS

#: Each this many parents a todo names (`after`) count as one more creation against the agent's
#: quota: a parent named costs the database a read and an edge written, as a todo does a row.
PARENTS_PER_CREATE = 10

#: Longest Retry-After of a claim refused at the agent's quota of held todos, in seconds.
HELD_RETRY_MAX = 60
#: JSON of a complete, fail or heartbeat up to this many bytes is not counted against the
#: agent's quota of bytes: no more than the row each of them writes anyway, and counting it
#: would cost each of those calls a second statement. Creations count every byte: their
#: statement counts the todos already.
UNCOUNTED_BYTES = 1024


def max_held(agent: Agent) -> int:
    """The most todos the agent may hold at once (in each database its queues live in)."""
    return _quota(agent.max_held, conf.AGENT_MAX_HELD)


def refuse_at_held_quota(agent: Agent, aliases: list[str], quota: int) -> None:
    """Raise Throttled when the agent holds `quota` todos in each of the databases `aliases`.

    Retry-After is the time until the earliest of its leases ends (1 to HELD_RETRY_MAX s):
    by then it has completed, failed or released that todo, or the lease expired and the
    reaper takes the todo back; freeing one itself makes room at once.
    """
    ends: list[float] = []
    for alias in aliases:
        with cursors.cursor(connections[alias]) as cursor:
            cursor.execute(agent_queries["held"], {"owner": agent.name})
            held, ends_in = cursor.fetchone()
        if held < quota:
            return
        if ends_in is not None:
            ends.append(ends_in)
    raise _throttled(
        f"Agent {agent.name!r} holds {held} todos, its quota (max_held {quota}): complete, "
        "fail or release one before claiming more.",
        min(HELD_RETRY_MAX, max(1.0, min(ends, default=1.0))),
    )


def count_creates(agent: Agent, count: int, size: int) -> None:
    """Count `count` creations, whose payloads are `size` bytes of JSON, against the agent's
    paced quotas a minute (count_writes, agents.sql): Throttled, and nothing counted, past
    either; InvalidTodo when `count` is more than the whole quota, which waiting would never
    make room for."""
    quota = _quota(agent.max_creates_per_minute, conf.AGENT_MAX_CREATES_PER_MINUTE)
    if count > quota:
        raise InvalidTodo(
            f"This create counts {count} creations (one a todo, and one for each "
            f"{PARENTS_PER_CREATE} parents a todo names in `after`): more than agent "
            f"{agent.name!r} may create in a minute (max_creates_per_minute {quota}): make it "
            "smaller; nothing was created."
        )
    wait = _count(agent, size, count=count, quota=quota)
    if wait is not None:
        wait = _turn(agent, "creations", wait, count * 60 / quota)
        what = "a todo" if count == 1 else f"{count} creations"
        raise _throttled(
            f"Agent {agent.name!r} has no room for {what} now: its quota of {quota} todos a "
            f"minute (max_creates_per_minute) is paced, at most {_burst_text(agent)} seconds' "
            "worth at once; nothing was created.",
            wait,
        )


def count_bytes(agent: Agent, text: str | None) -> None:
    """Count the JSON `text` a complete or heartbeat writes against the agent's quota of bytes a
    minute, as count_creates does; at most UNCOUNTED_BYTES of it is not counted."""
    size = _counted_size(text)
    if size:
        _count(agent, size)


def count_fail(agent: Agent, text: str | None) -> None:
    """Count a fail or release against the agent's paced quota of them a minute, and the JSON
    `text` it writes (the error) against its quota of bytes, as count_bytes does: Throttled,
    and nothing counted, past either. Each puts a todo back to be claimed again: without a
    quota, an agent failing its own todos as fast as it claims them took the server's time
    from every other agent, whatever its quota of bytes."""
    _count(agent, _counted_size(text), fails=1)


def _counted_size(text: str | None) -> int:
    """The bytes of a holder's JSON `text` the quota of bytes counts: none up to
    UNCOUNTED_BYTES, all of them past it."""
    size = 0 if text is None else validation.json_bytes(text)
    return size if size > UNCOUNTED_BYTES else 0


def burst_seconds(agent: Agent) -> float:
    """The most seconds' worth of its quotas a minute the agent may spend at once: its own
    `burst_seconds`, else SWITCHBOARD_TODOS_AGENT_BURST_SECONDS."""
    own = agent.burst_seconds
    return conf.AGENT_BURST_SECONDS if own is None else float(own)


def room(agent: Agent) -> tuple[int, int, int]:
    """The creations, bytes of JSON and fails or releases the agent may write at once now
    (paced_room)."""
    with cursors.cursor(connections[router.db_for_read(Agent)]) as cursor:
        cursor.execute(
            agent_queries["paced_room"],
            {
                "agent_id": agent.pk,
                "quota": _quota(agent.max_creates_per_minute, conf.AGENT_MAX_CREATES_PER_MINUTE),
                "byte_quota": _quota(agent.max_bytes_per_minute, conf.AGENT_MAX_BYTES_PER_MINUTE),
                "fail_quota": _fail_quota(agent),
                "burst": burst_seconds(agent),
            },
        )
        row = cursor.fetchone()
    return (0, 0, 0) if row is None else (int(row[0]), int(row[1]), int(row[2]))


def _count(
    agent: Agent, size: int, *, count: int = 0, quota: int = 0, fails: int = 0
) -> float | None:
    """Run count_writes: None once counted; Throttled past the quota of bytes (InvalidTodo
    for more than all of it) or of fails; past the creations' quota, the seconds until the
    write fits."""
    byte_quota = _quota(agent.max_bytes_per_minute, conf.AGENT_MAX_BYTES_PER_MINUTE)
    fail_quota = _fail_quota(agent)
    if size > byte_quota:
        raise InvalidTodo(
            f"{size} bytes of JSON are more than agent {agent.name!r} may write in a minute "
            f"(max_bytes_per_minute {byte_quota}): make it smaller; nothing was written."
        )
    with cursors.cursor(connections[router.db_for_write(Agent)]) as cursor:
        cursor.execute(
            agent_queries["count_writes"],
            {
                "agent_id": agent.pk,
                "count": count,
                "quota": quota,
                "bytes": size,
                "byte_quota": byte_quota,
                "fails": fails,
                "fail_quota": fail_quota,
                "burst": burst_seconds(agent),
            },
        )
        row = cursor.fetchone()
    if row is None:
        raise NotAuthenticated("Unknown token.")  # the agent was deleted since the request began
    counted, refused_by, wait = row
    if counted:
        return None
    # A write that lost the room to one queued before it: its own quota's turn.
    refused_by = refused_by or ("creations" if count else "fails" if fails else "bytes")
    if refused_by == "bytes":
        wait = _turn(agent, "bytes", wait, size * 60 / byte_quota)
        raise _throttled(
            f"Agent {agent.name!r} has no room for {size} more bytes now: its quota of "
            f"{byte_quota} bytes of JSON a minute (max_bytes_per_minute) is paced, at most "
            f"{_burst_text(agent)} seconds' worth at once; nothing was written.",
            wait,
        )
    if refused_by == "fails":
        wait = _turn(agent, "fails", wait, 60 / fail_quota)
        raise _throttled(
            f"Agent {agent.name!r} has no room to fail or release a todo now: its quota of "
            f"{fail_quota} a minute (max_fails_per_minute) is paced, at most "
            f"{_burst_text(agent)} seconds' worth at once; nothing was written (a todo it "
            "holds stays held until its lease ends).",
            wait,
        )
    return float(wait)


def _fail_quota(agent: Agent) -> int:
    return _quota(agent.max_fails_per_minute, conf.AGENT_MAX_FAILS_PER_MINUTE)


#: The turn this process last told a refused write of each agent (by its token's hash: a new
#: token starts afresh) and quota to come back at (`_turn`), in time.monotonic().
_turns: dict[tuple[str, str], float] = {}
_turns_lock = threading.Lock()
#: Past this many remembered turns, those already past are forgotten (`_turn`): a turn in the
#: past tells nothing, and rotated tokens and deleted agents would otherwise stay for good.
TURNS_KEPT = 1024


def _turn(agent: Agent, paced: str, wait: float, worth: float) -> float:
    """How long to tell a write the `paced` quota refused to wait: `wait`, the time until it
    fits, or the next free turn of the agent's refused writes, whichever is later; a turn lasts
    what the write is `worth` at the quota's pace (its seconds' share of a minute's quota).

    Told the same `wait`, 120 refused requests would come back at once and be refused again
    (each refusal is a request the server answers); told one turn each, callers that obey
    Retry-After come back at the quota's pace, and most of them are then let through. Turns are
    this process's: each server process paces the refusals it answers.
    """
    now = time.monotonic()
    with _turns_lock:
        if len(_turns) >= TURNS_KEPT:
            for past in [key for key, turn in _turns.items() if turn <= now]:
                del _turns[past]
        turn = max(_turns.get((agent.token_hash, paced), 0.0) + worth, now + wait)
        _turns[(agent.token_hash, paced)] = turn
    return turn - now


def _burst_text(agent: Agent) -> str:
    return f"{burst_seconds(agent):g}"


def max_attempts(agent: Agent, given: int | None) -> int:
    """The `max_attempts` of a todo the agent creates: at most its limit (InvalidTodo above, as
    waiting would never make it acceptable); without one, the default, lowered to the limit."""
    limit = max(1, _quota(agent.max_attempts_limit, conf.AGENT_MAX_ATTEMPTS))
    if given is None:
        return min(DEFAULT_MAX_ATTEMPTS, limit)
    if isinstance(given, int) and not isinstance(given, bool) and given > limit:
        raise InvalidTodo(
            f"max_attempts must be at most {limit} for agent {agent.name!r} (its limit), "
            f"not {given}."
        )
    return given


def _quota(own: int | None, setting: int) -> int:
    """One of an agent's quotas: its own value (its Agent field), else the project's setting."""
    return setting if own is None else own


def _throttled(message: str, seconds: float) -> Throttled:
    """Throttled, its message saying how long to wait: MCP and SQS answers have no Retry-After."""
    wait = Throttled(message, retry_after=seconds).retry_after  # whole seconds, at least 1
    return Throttled(f"{message} Try again in {wait} s.", retry_after=wait)
