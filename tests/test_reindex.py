"""todo_reindex: a claim index left bloated by held-back vacuum is rebuilt, without a lock
that stops claims; one that is not is left alone."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from switchboard_todos.upkeep.reindex import index_bloat, reindex

pytestmark = pytest.mark.django_db(transaction=True)


def pending_index_size() -> int:
    return next(found.size for found in index_bloat() if found.name == "idx_todos_pending")


def bloat_the_pending_index() -> None:
    """30,000 ready todos, all then claimed and done, vacuumed: the index keeps its pages. Each
    takes its creation time as its turn, as a todo without a fair key does: 30,000 equal turns
    would be deduplicated into a few pages."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO todos (kind, created_at, fair_at) "
            "SELECT 'k', now() - n * interval '1 millisecond', now() - n * interval '1 millisecond'"
            " FROM generate_series(1, 30000) n"
        )
        cursor.execute("UPDATE todos SET state = 'done', completed_at = now()")
        cursor.execute("VACUUM todos")


def run(*args: str) -> str:
    out = StringIO()
    call_command("todo_reindex", *args, stdout=out)
    return out.getvalue()


def test_a_bloated_claim_index_is_rebuilt() -> None:
    bloat_the_pending_index()
    before = pending_index_size()
    assert before > 1024 * 1024
    dry = run("--min-ratio", "1.1", "--dry-run")
    assert "idx_todos_pending:" in dry and "left alone" in dry
    assert pending_index_size() == before
    output = run("--min-ratio", "1.1")
    assert "idx_todos_pending:" in output and "rebuilt:" in output
    assert pending_index_size() < before / 10
    assert "idx_todos_lease:" in output and "left alone" in output


def test_a_healthy_index_is_left_alone() -> None:
    assert "rebuilt" not in run()


def test_bad_uses_are_refused() -> None:
    with pytest.raises(CommandError, match="--min-ratio must be more than 1"):
        run("--min-ratio", "1")
    with pytest.raises(ValueError, match="not a claim index"):
        reindex("todos_pkey")
