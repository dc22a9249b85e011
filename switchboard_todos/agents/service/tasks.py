"""MCP tasks (SEP-1686): a todo an agent created, followed by a task id bound to that agent.

A task is a row of todo_tasks beside its todo: its id is random (256 bits), so it cannot be
guessed, and every read names the agent, so another agent's id answers as an unknown one
(TaskNotFound). The task's state is its todo's; it is kept for its `ttl` (at most
SWITCHBOARD_TODOS_TASK_TTL_MAX seconds), and its todo with it, whatever the retention: past
that, it is unknown. Waiting for a task to end is a chain of long polls of its todo (each one
counted against the agent's long-poll cap, as `get_todo`'s wait).
"""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from django.db import connections, router
from django.db.models import Q, QuerySet
from django.db.models.functions import Now

from switchboard_todos import endings
from switchboard_todos.agents import long_poll_cap
from switchboard_todos.agents.service import reading, visibility
from switchboard_todos.agents.service.twins import twin
from switchboard_todos.conf import conf
from switchboard_todos.exceptions import InvalidTodo, TaskNotFound, TodoConflict
from switchboard_todos.models import Agent, Todo, TodoTask
from switchboard_todos.sql import agent_queries

#: A task id: `tk_` and 43 characters of URL-safe base64 (secrets.token_urlsafe(32)).
TASK_ID = re.compile(r"tk_[A-Za-z0-9_-]{43}")
#: Tasks on one page of `list_tasks`.
TASK_PAGE = 50
#: A page's position: the microsecond its last task was created, and its id.
_CURSOR = re.compile(r"([0-9]{1,16}):(tk_[A-Za-z0-9_-]{43})")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


class AgentTask(NamedTuple):
    """A task, and its todo as it is now."""

    task: TodoTask
    todo: Todo


class TaskPage(NamedTuple):
    tasks: list[AgentTask]
    next_cursor: str | None


def ttl_ms(requested: object) -> int:
    """The ttl a task gets, in milliseconds: the client's, within TASK_TTL_MAX (the maximum
    when it asks for none, or for more)."""
    most = conf.TASK_TTL_MAX * 1000
    if requested is None:
        return most
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise InvalidTodo(f"task ttl must be a whole number of milliseconds, not {requested!r}.")
    return min(requested, most)


def start_task(agent: Agent, todo_id: str, ttl: int, tool: str, created: bool) -> AgentTask:
    """A new task of `agent` for the todo `todo_id` its call of `tool` just made (`created`:
    not found by its key), kept `ttl` milliseconds: a todo the agent may read, in its database."""
    todo = reading.seen_todo(agent, todo_id)
    alias = todo._state.db or router.db_for_write(Todo)
    params = {"id": f"tk_{secrets.token_urlsafe(32)}", "agent": agent.name, "todo_id": todo.id}
    with connections[alias].cursor() as cursor:
        cursor.execute(
            agent_queries["create_task"],
            {**params, "ttl_ms": ttl, "tool": tool, "created": created},
        )
        columns = [column.name for column in cursor.description]
        task = TodoTask(**dict(zip(columns, cursor.fetchone(), strict=True)))
    task._state.db, task._state.adding = alias, False
    return AgentTask(task, todo)


def check_merging_plan(todos: object) -> None:
    """InvalidTodo unless the plan's last todo waits, directly or through others of the plan,
    for every other one of it: the merging todo that a task-augmented create_many follows."""
    if not isinstance(todos, list) or not todos or not all(isinstance(t, dict) for t in todos):
        return  # the tool refuses it, saying why
    refs = {todo.get("ref"): number for number, todo in enumerate(todos) if todo.get("ref")}
    reached, left = {len(todos) - 1}, [len(todos) - 1]
    while left:
        after = todos[left.pop()].get("after")
        for parent in after if isinstance(after, list) else []:
            number = refs.get(parent)
            if number is not None and number not in reached:
                reached.add(number)
                left.append(number)
    if len(reached) < len(todos):
        raise InvalidTodo(
            "A plan run as a task needs a merging todo: its last todo must wait (in `after`, "
            "directly or through others of the plan) for every other todo of the plan; "
            f"{len(todos) - len(reached)} of them it does not wait for."
        )


def get_task(agent: Agent, task_id: object) -> AgentTask:
    """The agent's task of `task_id` and its todo; TaskNotFound for any other id, another
    agent's, or one whose ttl has passed."""
    checked = _task_id(task_id)
    for alias in visibility.read_databases(agent):
        task = _live(agent).using(alias).filter(pk=checked).first()
        if task is not None:
            todo = Todo.objects.using(alias).filter(pk=task.todo_id).first()
            if todo is None:  # purged by an operator: the task cannot say how it ended
                break
            return AgentTask(task, todo)
    raise TaskNotFound(checked)


def list_tasks(agent: Agent, cursor: str | None = None) -> TaskPage:
    """The agent's live tasks, newest first, TASK_PAGE a page; `cursor` is `next_cursor`."""
    tasks = _live(agent)
    if cursor is not None:
        after, after_id = _decode_cursor(cursor)
        tasks = tasks.filter(Q(created_at__lt=after) | Q(created_at=after, id__lt=after_id))
    found: list[AgentTask] = []
    for alias in visibility.read_databases(agent):
        page = list(tasks.using(alias).order_by("-created_at", "-id")[: TASK_PAGE + 1])
        todos = Todo.objects.using(alias).in_bulk([task.todo_id for task in page])
        found += [AgentTask(task, todos[task.todo_id]) for task in page if task.todo_id in todos]
    found.sort(key=lambda each: (each.task.created_at, each.task.id), reverse=True)
    if len(found) <= TASK_PAGE:
        return TaskPage(found, None)
    last = found[TASK_PAGE - 1].task
    return TaskPage(found[:TASK_PAGE], f"{(last.created_at - _EPOCH) // _MICROSECOND}:{last.id}")


def cancel_task(agent: Agent, task_id: object) -> AgentTask:
    """Cancel the todo of the agent's task (the operator's cancel: a dead letter whose result
    says Cancelled; its holder is told at its next heartbeat). TodoConflict when it has ended
    already."""
    task, todo = get_task(agent, task_id)
    reason = f"Cancelled by agent {agent.name!r}, which created it (task {task.id})."
    try:
        ended = Todo.objects.db_manager(todo._state.db).cancel(todo.id, reason)
    except TodoConflict:
        ended = Todo.objects.using(todo._state.db).get(pk=todo.id)
        raise TodoConflict(
            f"Cannot cancel task {task.id!r}: its todo is {ended.state} already.",
            todo_id=todo.id,
            state=ended.state,
        ) from None
    return AgentTask(task, ended)


async def await_task(agent: Agent, task_id: object) -> AgentTask:
    """The agent's task once its todo has ended: long polls of MAX_WAIT seconds each, one
    after the other, each counted against the agent's long-poll cap (Throttled past it)."""
    task, todo = await aget_task(agent, task_id)
    while todo.state not in endings.ENDED:
        async with long_poll_cap.awaiting(agent, long_poll_cap.MAX_WAIT):
            todo = await Todo.objects.db_manager(todo._state.db).await_for(
                todo.id, long_poll_cap.MAX_WAIT
            )
    return AgentTask(task, todo)


def _live(agent: Agent) -> QuerySet[TodoTask]:
    """The agent's tasks whose ttl has not passed (the database's clock)."""
    return TodoTask.objects.filter(agent=agent.name, keep_until__gt=Now())


def _task_id(value: object) -> str:
    if not isinstance(value, str) or TASK_ID.fullmatch(value) is None:
        raise TaskNotFound(str(value)[:64])  # no task could have it: unknown, as any other
    return value


def _decode_cursor(cursor: object) -> tuple[datetime, str]:
    match = _CURSOR.fullmatch(cursor) if isinstance(cursor, str) else None
    if match is None:
        raise InvalidTodo("cursor is not one that tasks/list returned.")
    micros, task_id = match.groups()
    return _EPOCH + int(micros) * _MICROSECOND, task_id  # 16 digits: before 2286


astart_task = twin(start_task)
aget_task = twin(get_task)
alist_tasks = twin(list_tasks)
acancel_task = twin(cancel_task)
