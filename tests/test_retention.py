"""A queue's retention: the reaper deletes its old done and failed todos, in bounded batches."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from django.db.models.functions import Now

from switchboard_todos import queue_settings
from switchboard_todos.models import State, Todo
from switchboard_todos.shutdown import Shutdown
from switchboard_todos.upkeep import retention
from switchboard_todos.upkeep.reaper import Reaper
from tests.helpers import MakeTodo
from tests.test_purge import explain, fill_for_plans

DAY = timedelta(days=1)


def finished(make_todo: MakeTodo, queue: str, state: str, ago: timedelta, title: str) -> Todo:
    """A todo of `queue` created and completed `ago` before the database's now."""
    return make_todo(
        queue=queue, state=state, created_ago=ago, completed_at=Now() - ago, title=title
    )


def remaining() -> set[str]:
    return set(Todo.objects.values_list("title", flat=True))


@pytest.fixture
def mail_kept_a_week(db: None) -> None:
    queue_settings.configure("mail", retention=timedelta(days=7))


def test_only_old_finished_todos_of_queues_with_a_retention_go(
    make_todo: MakeTodo, mail_kept_a_week: None
) -> None:
    """Done and failed todos past the queue's retention go; recent ones, live ones, and every
    todo of a queue without a retention stay, however old."""
    finished(make_todo, "mail", State.DONE, 8 * DAY, "old done")
    finished(make_todo, "mail", State.FAILED, 8 * DAY, "old dead letter")
    finished(make_todo, "mail", State.DONE, 6 * DAY, "recent done")
    make_todo(queue="mail", created_ago=30 * DAY, title="old pending")
    make_todo(queue="mail", state=State.CLAIMED, created_ago=30 * DAY, title="old claimed")
    # Created long ago, retried, and completed only yesterday: its retention starts then.
    make_todo(
        queue="mail",
        state=State.DONE,
        created_ago=30 * DAY,
        completed_at=Now() - DAY,
        title="completed lately",
    )
    finished(make_todo, "billing", State.DONE, 365 * DAY, "no retention")
    purged = retention.purge_retained()
    assert dict(purged.counts) == {("mail", "done"): 1, ("mail", "failed"): 1}
    assert not purged.unfinished
    assert remaining() == {
        "recent done",
        "old pending",
        "old claimed",
        "completed lately",
        "no retention",
    }


def test_each_queue_by_its_own_retention(make_todo: MakeTodo, mail_kept_a_week: None) -> None:
    queue_settings.configure("billing", retention=timedelta(hours=12))
    finished(make_todo, "mail", State.DONE, DAY, "mail, a day old")
    finished(make_todo, "billing", State.DONE, DAY, "billing, a day old")
    retention.purge_retained()
    assert remaining() == {"mail, a day old"}


def test_a_retention_changed_or_cleared_applies_at_the_next_purge(
    make_todo: MakeTodo, mail_kept_a_week: None
) -> None:
    finished(make_todo, "mail", State.DONE, 3 * DAY, "three days old")
    finished(make_todo, "mail", State.DONE, DAY, "a day old")
    queue_settings.configure("mail", retention=None)
    assert retention.purge_retained().total == 0
    queue_settings.configure("mail", retention=timedelta(days=2))
    retention.purge_retained()
    assert remaining() == {"a day old"}


def test_batches_are_bounded_and_the_queues_take_turns(
    make_todo: MakeTodo, mail_kept_a_week: None, django_assert_num_queries: Any
) -> None:
    """5 old todos in mail and 1 in billing, batches of 2: mail takes three batches, billing
    one, after the read of which queues have a retention."""
    queue_settings.configure("billing", retention=timedelta(days=7))
    for n in range(5):
        finished(make_todo, "mail", State.DONE, (8 + n) * DAY, f"mail {n}")
    finished(make_todo, "billing", State.FAILED, 8 * DAY, "billing")
    with django_assert_num_queries(1 + 4):
        purged = retention.purge_retained(batch_size=2)
    assert (purged.batches, dict(purged.counts)) == (
        4,
        {("mail", "done"): 5, ("billing", "failed"): 1},
    )
    assert remaining() == set()


def test_past_its_time_limit_a_purge_leaves_the_rest_to_the_next(
    make_todo: MakeTodo, mail_kept_a_week: None
) -> None:
    """Each queue gets one batch at least; then, out of time, the purge says what it left."""
    for n in range(3):
        finished(make_todo, "mail", State.DONE, (8 + n) * DAY, f"mail {n}")
    first = retention.purge_retained(batch_size=2, time_limit=0)
    assert (first.total, first.unfinished) == (2, True)
    assert remaining() == {"mail 0"}  # the oldest first
    second = retention.purge_retained(batch_size=2, time_limit=0)
    assert (second.total, second.unfinished) == (1, False)


@pytest.mark.django_db(transaction=True)
def test_the_reapers_sweep_applies_the_retention_and_logs_the_counts(
    make_todo: MakeTodo, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.SWITCHBOARD_TODOS_REAP_BATCH = 2
    queue_settings.configure("mail", retention=timedelta(days=7))
    for n in range(3):
        finished(make_todo, "mail", State.DONE, 8 * DAY, f"done {n}")
    finished(make_todo, "mail", State.FAILED, 8 * DAY, "dead letter")
    finished(make_todo, "mail", State.DONE, DAY, "recent")
    lines: list[str] = []
    with Shutdown() as shutdown, caplog.at_level(logging.INFO, "switchboard_todos.reaper"):
        totals = Reaper(interval=0, shutdown=shutdown, max_sweeps=1, report=lines.append).run()
    assert totals.purged == 4
    assert lines == ["Reaped lapsed leases: 0 requeued, 0 dead-lettered; 4 deleted by retention."]
    assert "Retention in database 'default': deleted 3 done of mail, 1 failed of mail." in (
        caplog.messages
    )
    assert remaining() == {"recent"}


@pytest.mark.django_db(transaction=True)
def test_the_scheduler_alone_applies_no_retention(make_todo: MakeTodo) -> None:
    queue_settings.configure("mail", retention=timedelta(days=7))
    finished(make_todo, "mail", State.DONE, 8 * DAY, "old")
    with Shutdown() as shutdown:
        Reaper(interval=0, shutdown=shutdown, max_sweeps=1, reaping=False).run()
    assert remaining() == {"old"}


def test_a_purge_starts_where_the_last_one_stopped(
    make_todo: MakeTodo, mail_kept_a_week: None
) -> None:
    """With the marks a reaper keeps, a purge does not walk again what the last one passed:
    a todo completes at now(), so none that it may delete appears behind the mark."""
    finished(make_todo, "mail", State.DONE, 9 * DAY, "nine days")
    marks: dict[str, Any] = {}
    retention.purge_retained(marks=marks)
    assert set(marks) == {"mail"} and remaining() == set()
    finished(make_todo, "mail", State.DONE, 10 * DAY, "behind the mark")
    assert retention.purge_retained(marks=marks).total == 0
    assert retention.purge_retained().total == 1


def test_a_batch_walks_the_finished_index(db: None) -> None:
    """With many live and finished todos, a batch reads idx_todos_finished, as purge_todos's
    do, from the mark on; the DELETE probes the primary key."""
    fill_for_plans()
    queue_settings.configure("mail", retention=timedelta(days=20))
    params: dict[str, Any] = {
        "queue": "mail",
        "retention": timedelta(days=20),
        "limit": 1000,
        "after": None,
    }
    plan = explain("purge_retained", params)
    # The index gives the order, so the LIMIT stops the scan after one batch of rows: no Sort
    # (but the count of the batch's todos that tasks keep, by queue).
    assert "Index Scan using idx_todos_finished on todos " in plan, plan
    assert "Sort" not in plan.split("CTE unkept")[0], plan
    assert "Index Cond: (id = ANY" in plan, plan
    assert "Index Cond: (todo_id = ANY" in plan, plan
    assert "Seq Scan" not in plan, plan
