-- Retention: deleting finished todos, in bounded batches, on an operator's purge (purge_batch,
-- and its dry run count_purgeable) and by the reaper for the queues with a retention
-- (retained_queues, purge_retained). Format and conventions: shared.sql.

-- fragment: purged(doomed)
-- The body of a purge's "deleted" CTE: delete the todos `doomed` picked. = ANY(ARRAY(...)), not
-- IN (SELECT ...): an array is probed through the primary key; a semi-join may be planned as a
-- hash join over a scan of the whole table.
DELETE FROM todos
 WHERE id = ANY (ARRAY(SELECT id FROM $doomed))
RETURNING id, queue, state, completed_at

-- fragment: unlinked(deleted)
-- The body of a purge's "unlinked" CTE: delete the todo_edges rows of the todos `deleted`
-- deleted, as parents (the primary key) and as children (idx_todo_edges_child).
DELETE FROM todo_edges
 WHERE parent_id = ANY (ARRAY(SELECT id FROM $deleted))
    OR child_id = ANY (ARRAY(SELECT id FROM $deleted))

-- fragment: kept_by_a_task(todo)
-- Whether an MCP task (todo_tasks) keeps the todo `todo`: until the task's keep_until (its
-- ttl) has passed, whatever the retention. A scalar subquery, one probe of idx_todo_tasks_todo
-- per todo: EXISTS may be planned as a join that reads every live task.
(SELECT true FROM todo_tasks
  WHERE todo_tasks.todo_id = $todo.id AND todo_tasks.keep_until > now()
  LIMIT 1) IS NOT NULL

-- fragment: untasked(deleted)
-- The body of a purge's "untasked" CTE: delete the MCP tasks of the todos `deleted` deleted
-- (whose keep_until had passed).
DELETE FROM todo_tasks
 WHERE todo_id = ANY (ARRAY(SELECT id FROM $deleted))

-- fragment: kept_and_deleted(doomed, deleted)
-- The answer of a purge's batch: per queue and state, the todos `deleted` deleted and the
-- newest completed_at among them; and per queue, as state 'kept', the todos of `doomed` that a
-- task keeps, and the oldest completed_at among them: the batch walked past them, and deleted
-- them not (retention.py counts them as walked, and a reaper's mark does not pass them).
SELECT queue, state, count(*) AS deleted, max(completed_at) AS newest
  FROM $deleted GROUP BY queue, state
UNION ALL
SELECT queue, 'kept', count(*), min(completed_at)
  FROM $doomed WHERE {{kept_by_a_task(doomed)}} GROUP BY queue

-- fragment: purged_history(doomed)
-- The body of a purge's "forgotten" CTE: the failure histories (todo_errors) of the todos
-- `doomed` picked, deleted with them.
DELETE FROM todo_errors
 WHERE todo_id = ANY (ARRAY(SELECT id FROM $doomed))

-- name: purge_batch
-- Delete up to %(limit)s finished todos (%(states)s, only done or failed) completed more than
-- %(older_than)s ago and at or after %(after)s, oldest first; one short transaction per batch.
-- Rows another session holds are skipped, never waited for. Walking idx_todos_finished from
-- %(after)s (the newest completed_at of the previous batch) keeps every batch as cheap as the
-- first: the index entries of rows deleted by earlier batches are never walked again. Returns
-- the todos deleted per queue and state, with the newest completed_at of each (where the next
-- batch starts). Their edges (todo_edges) and MCP tasks (todo_tasks) are deleted with them;
-- the todos an MCP task keeps are walked past, not deleted (kept_and_deleted).
WITH doomed AS (
    SELECT id, queue, completed_at
      FROM todos
     WHERE state IN ('done', 'failed')
       AND state = ANY (%(states)s::text[])
       AND completed_at < now() - %(older_than)s::interval
       AND completed_at >= coalesce(%(after)s::timestamptz, '-infinity')
       AND (%(queues)s::text[] IS NULL OR queue = ANY (%(queues)s::text[]))
     {{oldest_batch(completed_at)}}
),
unkept AS (SELECT id FROM doomed WHERE NOT {{kept_by_a_task(doomed)}}),
deleted AS ({{purged(unkept)}}),
unlinked AS ({{unlinked(deleted)}}),
untasked AS ({{untasked(deleted)}}),
forgotten AS ({{purged_history(unkept)}})
{{kept_and_deleted(doomed, deleted)}};

-- name: purge_retained
-- Delete up to %(limit)s done and failed todos of queue %(queue)s completed longer ago than its
-- retention, %(retention)s, and at or after %(after)s, oldest first; one bounded batch, which
-- the reaper repeats while batches come back full. Nothing when the queue's retention
-- (todo_queues) has since been cleared or made longer. Like purge_batch it walks
-- idx_todos_finished from %(after)s, the newest completed_at a previous batch deleted: a todo
-- is only ever completed at now(), so no deletable todo appears behind that mark, and the
-- reaper keeps it from sweep to sweep instead of walking again, every few seconds, past the
-- finished todos of queues kept for ever. Rows another session holds are skipped. Returns
-- what purge_batch does, and deletes as it does, edges and tasks included.
WITH doomed AS (
    SELECT id, queue, completed_at
      FROM todos
     WHERE state IN ('done', 'failed')
       AND completed_at < now() - %(retention)s::interval
       AND completed_at >= coalesce(%(after)s::timestamptz, '-infinity')
       AND queue = %(queue)s
       AND %(retention)s::interval <= (SELECT retention FROM todo_queues WHERE name = %(queue)s)
     {{oldest_batch(completed_at)}}
),
unkept AS (SELECT id FROM doomed WHERE NOT {{kept_by_a_task(doomed)}}),
deleted AS ({{purged(unkept)}}),
unlinked AS ({{unlinked(deleted)}}),
untasked AS ({{untasked(deleted)}}),
forgotten AS ({{purged_history(unkept)}})
{{kept_and_deleted(doomed, deleted)}};

-- name: retained_queues
-- The queues with a retention (todo_queues), which the reaper purges, and their retention.
SELECT name, retention FROM todo_queues WHERE retention IS NOT NULL ORDER BY name;

-- name: count_purgeable
-- Count, per queue and state, the todos purge_batch would delete with the same parameters.
SELECT queue, state, count(*) AS deleted
  FROM todos
 WHERE state IN ('done', 'failed')
   AND state = ANY (%(states)s::text[])
   AND completed_at < now() - %(older_than)s::interval
   AND (%(queues)s::text[] IS NULL OR queue = ANY (%(queues)s::text[]))
   AND NOT {{kept_by_a_task(todos)}}
 GROUP BY queue, state
 ORDER BY queue, state;
