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
-- batch starts). Their edges (todo_edges) are deleted with them.
WITH doomed AS (
    SELECT id
      FROM todos
     WHERE state IN ('done', 'failed')
       AND state = ANY (%(states)s::text[])
       AND completed_at < now() - %(older_than)s::interval
       AND completed_at >= coalesce(%(after)s::timestamptz, '-infinity')
       AND (%(queues)s::text[] IS NULL OR queue = ANY (%(queues)s::text[]))
     {{oldest_batch(completed_at)}}
),
deleted AS ({{purged(doomed)}}),
unlinked AS ({{unlinked(deleted)}}),
forgotten AS ({{purged_history(doomed)}})
SELECT queue, state, count(*) AS deleted, max(completed_at) AS newest
  FROM deleted GROUP BY queue, state;

-- name: purge_retained
-- Delete up to %(limit)s done and failed todos of queue %(queue)s completed longer ago than its
-- retention, %(retention)s, and at or after %(after)s, oldest first; one bounded batch, which
-- the reaper repeats while batches come back full. Nothing when the queue's retention
-- (todo_queues) has since been cleared or made longer. Like purge_batch it walks
-- idx_todos_finished from %(after)s, the newest completed_at a previous batch deleted: a todo
-- is only ever completed at now(), so no deletable todo appears behind that mark, and the
-- reaper keeps it from sweep to sweep instead of walking again, every few seconds, past the
-- finished todos of queues kept for ever. Rows another session holds are skipped. Returns
-- what purge_batch does, and deletes as it does, edges included.
WITH doomed AS (
    SELECT id
      FROM todos
     WHERE state IN ('done', 'failed')
       AND completed_at < now() - %(retention)s::interval
       AND completed_at >= coalesce(%(after)s::timestamptz, '-infinity')
       AND queue = %(queue)s
       AND %(retention)s::interval <= (SELECT retention FROM todo_queues WHERE name = %(queue)s)
     {{oldest_batch(completed_at)}}
),
deleted AS ({{purged(doomed)}}),
unlinked AS ({{unlinked(deleted)}}),
forgotten AS ({{purged_history(doomed)}})
SELECT queue, state, count(*) AS deleted, max(completed_at) AS newest
  FROM deleted GROUP BY queue, state;

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
 GROUP BY queue, state
 ORDER BY queue, state;
