-- Operating on todos, as the reaper and operators do: take back expired leases (reap_expired),
-- recount the children whose creation raced a parent's end (repair_blocked), redrive dead
-- letters (requeue), end leases now (expire_lease), cancel, reprioritise
-- (set_priority), and read why a guarded statement touched no row (classify_miss).
-- Format and conventions: shared.sql.

-- name: reap_expired
-- Return up to %(limit)s expired leases to pending, the longest expired first, or dead-letter
-- them when their attempts are used up (settling the todos that wait for them: lost, in
-- shared.sql): one bounded batch, which the reaper repeats while batches come back full. Rows
-- another session is transitioning right now are skipped, so reapers never block or race.
WITH expired AS MATERIALIZED (
    SELECT id, owner, attempt, claimed_at
      FROM todos
     WHERE state = 'claimed' AND lease_expires_at <= now()
     {{oldest_batch(lease_expires_at)}}
),
entry AS MATERIALIZED ({{error_entries(expired, owner, {{lease_expired}})}}),
trimmed AS ({{trimmed(entry)}}),
noted AS ({{noted(entry)}}),
reaped AS (
    UPDATE todos
       SET state = CASE WHEN attempt >= max_attempts THEN 'failed' ELSE 'pending' END,
           owner = NULL,
           lease_expires_at = NULL,
           result = CASE WHEN attempt >= max_attempts THEN jsonb_build_object('type', 'LeaseExpired',
                        'message', 'The lease lapsed on the last attempt.') ELSE result END,
           errors_dropped = errors_dropped + {{dropped(trimmed, todos)}},
           errors_bytes = errors_bytes + {{grown(entry, trimmed, todos)}},
           completed_at = CASE WHEN attempt >= max_attempts THEN now() END,
           updated_at = now()
     WHERE todos.id = ANY (ARRAY(SELECT id FROM expired))
    RETURNING todos.id, todos.state, todos.queue, todos.awaited
),
lost AS MATERIALIZED ({{lost(reaped WHERE state = 'failed')}}),
spared AS MATERIALIZED ({{spared(reaped WHERE state = 'failed', lost)}}),
held_below AS MATERIALIZED ({{locked_in_order(SELECT id FROM lost UNION SELECT child_id FROM spared)}}),
entry_below AS MATERIALIZED ({{error_entries({{lost_held(lost, held_below)}}, NULL, {{parent_failed(parent)}})}}),
trimmed_below AS ({{trimmed(entry_below)}}),
noted_below AS ({{noted(entry_below)}}),
cancelled_below AS ({{cancelled_below(lost, held_below, entry_below, trimmed_below)}}),
waiting AS MATERIALIZED ({{locked_in_order(SELECT child_id FROM spared)}}),
unblocked AS ({{unblocked(spared, waiting)}}),
finished AS (
    SELECT pg_notify('switchboard_todos_done', id)
      FROM (SELECT id, awaited FROM reaped WHERE state = 'failed'
            UNION ALL SELECT id, awaited FROM cancelled_below) AS ended
     WHERE awaited
),
notified AS (
    SELECT pg_notify('switchboard_todos', queue)
      FROM (SELECT DISTINCT queue
              FROM (SELECT queue, state FROM reaped
                    UNION ALL SELECT queue, state FROM unblocked WHERE waiting_for <= 0) AS woken
             WHERE state = 'pending' AND %(notify)s) AS claimable
)
SELECT count(*) FILTER (WHERE state = 'pending') AS requeued,
       count(*) FILTER (WHERE state = 'failed') AS dead_lettered,
       coalesce(array_agg(id), '{}') AS ids
  FROM reaped
 WHERE (SELECT count(*) FROM notified) >= 0 AND (SELECT count(*) FROM finished) >= 0;

-- name: repair_blocked
-- Recount the blocked todos created within %(within)s whose count is stale, up to %(limit)s of
-- them: the one race dependencies leave open (docs/dependencies.md). A child is created without
-- locking or writing its parents (parents_read in sql/creating.sql), so a parent that ends while
-- the child is being created can be counted by the child as not ended (the child's snapshot
-- predates the end), and not be found by the statement ending it (whose snapshot predates the
-- child): nothing would ever decrement that count. Here a child's count is recomputed from its
-- parents' states, never decremented: it waits for those pending or claimed. A stale one (it
-- counts more than that) whose policy is 'cancel' and which has a failed parent becomes a dead
-- letter saying which (parent_failed), as cancelled_below would have made it; any other takes
-- the new count, and one left with none is due now and notified, as "unblocked" would have
-- made it. Its own children are settled by the next run, one level each (the reaper's sweep
-- runs it until it changes nothing). Rows another session holds are skipped: a statement
-- finishing a parent holds the child locked, and decrements it itself. The parents are read
-- in this statement's snapshot, which may be older than the child's row (a parent ending
-- after it was taken decremented the child already): such a parent is counted as waiting, so
-- the recount is never too low, only late by one run. The window is on created_at, when the
-- creating transaction began: a child whose transaction stayed open longer than %(within)s
-- before it committed is not looked at (repair_blocked(within=...) by hand looks further).
WITH stale AS MATERIALIZED (
    SELECT todos.id, todos.attempt, todos.claimed_at, todos.on_parent_failure, counted.waiting,
           counted.failed
      FROM todos
     CROSS JOIN LATERAL (
            SELECT count(*) FILTER (WHERE parent.state IN ('pending', 'claimed')) AS waiting,
                   min(parent.id) FILTER (WHERE parent.state = 'failed') AS failed
              FROM todos AS parent
             WHERE parent.id = ANY (todos.parents)
           ) AS counted
     WHERE todos.state = 'pending' AND todos.waiting_for > 0
       AND todos.created_at > now() - %(within)s::interval
       AND counted.waiting < todos.waiting_for
     LIMIT %(limit)s
       FOR NO KEY UPDATE OF todos SKIP LOCKED
),
entry AS MATERIALIZED ({{error_entries(stale WHERE on_parent_failure = 'cancel' AND failed IS NOT NULL, NULL, {{parent_failed(failed)}})}}),
trimmed AS ({{trimmed(entry)}}),
noted AS ({{noted(entry)}}),
cancelled AS (
    UPDATE todos
       SET state = 'failed', next_retry_at = NULL, completed_at = now(), updated_at = now(),
           result = {{parent_failed(stale.failed)}},
           errors_dropped = errors_dropped + {{dropped(trimmed, todos)}},
           errors_bytes = errors_bytes + {{grown(entry, trimmed, todos)}}
      FROM stale
     WHERE todos.id = stale.id AND todos.state = 'pending'
       AND todos.on_parent_failure = 'cancel' AND stale.failed IS NOT NULL
    RETURNING todos.id, todos.state, todos.awaited
),
recounted AS (
    UPDATE todos
       SET waiting_for = stale.waiting,
           next_retry_at = CASE WHEN stale.waiting = 0 THEN now() ELSE todos.next_retry_at END,
           updated_at = now()
      FROM stale
     WHERE todos.id = stale.id AND todos.state = 'pending'
       AND (todos.on_parent_failure IS DISTINCT FROM 'cancel' OR stale.failed IS NULL)
    RETURNING todos.id, todos.queue, todos.state, todos.waiting_for
),
notified AS ({{notify_unblocked(recounted)}}),
finished AS ({{notify_ended(cancelled WHERE awaited)}})
SELECT id, state, waiting_for FROM recounted
 WHERE (SELECT count(*) FROM notified) >= 0 AND (SELECT count(*) FROM finished) >= 0
UNION ALL
SELECT id, state, 0 FROM cancelled;

-- fragment: parents_shared(todos)
-- The body of a CTE of requeue: the parents of the todos in `todos` (a CTE of ids) that are
-- not among them, locked FOR SHARE in id order and read as they are now, to count what those
-- todos wait for: a statement completing one of them waits for this one, then sees what it
-- brought back.
SELECT id, state
  FROM todos
 WHERE id = ANY (ARRAY(SELECT unnest(parents) FROM todos
                        WHERE id IN (SELECT id FROM $todos) AND parents IS NOT NULL))
   AND id NOT IN (SELECT id FROM $todos)
 ORDER BY id
   FOR SHARE

-- fragment: waiting_again(todo, back, parent)
-- How many parents the todo `todo` (an id) waits for as requeue brings it back: those brought
-- back with it (`back`, a SELECT of ids), and of its other parents (`parent`, parents_shared)
-- those neither done nor failed.
(SELECT count(*)
   FROM unnest(coalesce((SELECT t.parents FROM todos AS t WHERE t.id = $todo), '{}'))
        AS edge (id)
  WHERE edge.id IN ($back)
     OR edge.id IN (SELECT id FROM $parent WHERE state IN ('pending', 'claimed')))

-- name: requeue
-- Operator redrive: dead letters in %(ids)s back to pending with a fresh attempt budget, and
-- with them the todos that were cancelled because they failed (revived). Each that waits for
-- others waits again for those not done (waiting_again): blocked until then. Guard: failed,
-- and no live todo holds its idempotency key (else idx_todos_dedupe would fail); of several
-- dead letters in %(ids)s sharing a key, only the newest goes back.
-- The revived are the todos cancelled because a requeued todo failed, and in turn those
-- cancelled because they were (result "ParentFailed", its "parent"): pending again with a
-- fresh attempt budget, waiting again for their parents not done: blocked, or due now.
WITH wanted AS (
    SELECT DISTINCT ON (queue, coalesce(idempotency_key, id)) id
      FROM todos
     WHERE id = ANY (%(ids)s::text[]) AND state = 'failed'
     ORDER BY queue, coalesce(idempotency_key, id), created_at DESC, id
),
wanted_parent AS MATERIALIZED ({{parents_shared(wanted)}}),
requeued AS (
UPDATE todos
   SET state = 'pending', attempt = 0, owner = NULL, lease_expires_at = NULL,
       completed_at = NULL, updated_at = now(),
       waiting_for = {{waiting_again(wanted.id, SELECT id FROM wanted, wanted_parent)}},
       next_retry_at = CASE WHEN {{waiting_again(wanted.id, SELECT id FROM wanted, wanted_parent)}} > 0
                            THEN {{blocked}} END
  FROM wanted
 WHERE todos.id = wanted.id AND todos.state = 'failed'
   AND NOT EXISTS (
        SELECT FROM todos AS live
         WHERE live.queue = todos.queue
           AND live.idempotency_key = todos.idempotency_key
           AND {{live(live.state)}})
RETURNING todos.*
),
revived_set AS MATERIALIZED (
    WITH RECURSIVE below (id) AS (
        SELECT child.id
          FROM requeued
          JOIN todo_edges AS edge ON edge.parent_id = requeued.id
          JOIN todos AS child ON child.id = edge.child_id
         WHERE child.state = 'failed' AND child.result ->> 'type' = 'ParentFailed'
           AND child.result ->> 'parent' = requeued.id
        UNION
        SELECT child.id
          FROM below
          JOIN todo_edges AS edge ON edge.parent_id = below.id
          JOIN todos AS child ON child.id = edge.child_id
         WHERE child.state = 'failed' AND child.result ->> 'type' = 'ParentFailed'
           AND child.result ->> 'parent' = below.id
    )
    SELECT DISTINCT id FROM below
),
revived_back AS MATERIALIZED (
    SELECT id FROM revived_set UNION SELECT id FROM requeued
),
revived_parent AS MATERIALIZED ({{parents_shared(revived_back)}}),
revived AS (
UPDATE todos
   SET state = 'pending', attempt = 0, owner = NULL, lease_expires_at = NULL, result = NULL,
       completed_at = NULL, updated_at = now(),
       waiting_for = {{waiting_again(revived_set.id, SELECT id FROM revived_back, revived_parent)}},
       next_retry_at = CASE WHEN {{waiting_again(revived_set.id, SELECT id FROM revived_back, revived_parent)}} > 0
                            THEN {{blocked}} ELSE now() END
  FROM revived_set
 WHERE todos.id = revived_set.id AND todos.state = 'failed'
RETURNING todos.queue, todos.next_retry_at
),
notified AS (
    SELECT pg_notify('switchboard_todos', queue)
      FROM (SELECT queue FROM requeued WHERE next_retry_at IS NULL
            UNION SELECT queue FROM revived WHERE next_retry_at <= now()) AS woken
     WHERE %(notify)s
)
SELECT * FROM requeued WHERE (SELECT count(*) FROM notified) >= 0;

-- name: expire_lease
-- Operator: make the leases of the claimed todos in %(ids)s expire now, so the reaper or the
-- next claim takes them back. Guard: claimed. A lease that already expired keeps its time.
WITH expired AS (
UPDATE todos
   SET lease_expires_at = least(lease_expires_at, now()), updated_at = now()
 WHERE id = ANY (%(ids)s::text[]) AND state = 'claimed'
RETURNING *
),
notified AS (
    SELECT pg_notify('switchboard_todos', queue)
      FROM expired WHERE %(notify)s
)
SELECT * FROM expired WHERE (SELECT count(*) FROM notified) >= 0;

-- name: cancel
-- Operator cancel: the pending or claimed todos in %(ids)s become dead letters, %(reason)s
-- recorded as the result and in the failure history (with the attempt it ended, for a claimed
-- one), and the todos that wait for them are settled (lost, in shared.sql). A claimed todo's
-- lease ends, and it keeps its owner (cancelled_hold): the holder's next heartbeat, complete,
-- fail or release is told it was cancelled. Guard: pending or claimed, tested as the todos are
-- locked in id order ("held"), so that each entry is written with the attempt that ended.
WITH held AS MATERIALIZED (
    SELECT id, owner, attempt, claimed_at
      FROM todos
     WHERE id = ANY (%(ids)s::text[]) AND state IN ('pending', 'claimed')
     ORDER BY id
       FOR NO KEY UPDATE
),
entry AS MATERIALIZED ({{error_entries(held, owner, jsonb_build_object('type', 'Cancelled', 'message', %(reason)s::text))}}),
trimmed AS ({{trimmed(entry)}}),
noted AS ({{noted(entry)}}),
dead AS (
UPDATE todos
   SET state = 'failed',
       next_retry_at = NULL,
       lease_expires_at = NULL,
       result = jsonb_build_object('type', 'Cancelled', 'message', %(reason)s::text),
       errors_dropped = errors_dropped + {{dropped(trimmed, todos)}},
       errors_bytes = errors_bytes + {{grown(entry, trimmed, todos)}},
       completed_at = now(),
       updated_at = now()
 WHERE id = ANY (ARRAY(SELECT id FROM held))
RETURNING *
),
lost AS MATERIALIZED ({{lost(dead)}}),
spared AS MATERIALIZED ({{spared(dead, lost)}}),
held_below AS MATERIALIZED ({{locked_in_order(SELECT id FROM lost UNION SELECT child_id FROM spared)}}),
entry_below AS MATERIALIZED ({{error_entries({{lost_held(lost, held_below)}}, NULL, {{parent_failed(parent)}})}}),
trimmed_below AS ({{trimmed(entry_below)}}),
noted_below AS ({{noted(entry_below)}}),
cancelled_below AS ({{cancelled_below(lost, held_below, entry_below, trimmed_below)}}),
waiting AS MATERIALIZED ({{locked_in_order(SELECT child_id FROM spared)}}),
unblocked AS ({{unblocked(spared, waiting)}}),
notified AS ({{notify_unblocked(unblocked)}}),
finished AS (
    SELECT pg_notify('switchboard_todos_done', id)
      FROM (SELECT id, awaited FROM dead
            UNION ALL SELECT id, awaited FROM cancelled_below) AS ended
     WHERE awaited
)
SELECT * FROM dead
 WHERE (SELECT count(*) FROM notified) >= 0 AND (SELECT count(*) FROM finished) >= 0;

-- name: set_priority
-- Operator reprioritisation: the pending todos in %(ids)s get priority %(priority)s. Guard:
-- pending; a claimed or finished todo's priority decides nothing any more.
UPDATE todos
   SET priority = %(priority)s, updated_at = now()
 WHERE id = ANY (%(ids)s::text[]) AND state = 'pending'
RETURNING *;

-- name: classify_miss
-- Read what a guarded statement saw for each of %(ids)s, to say why it touched no row.
SELECT id, state, owner, assignee, queue, idempotency_key, concurrency_key, attempt, max_attempts,
       claimed_at,
       next_retry_at, next_retry_at > now() AS waiting,
       lease_expires_at, lease_expires_at <= now() AS lease_lapsed,
       {{cancelled_hold(todos)}} AS cancelled_hold, result ->> 'message' AS cancel_reason,
       (SELECT live.id FROM todos AS live
         WHERE live.queue = todos.queue AND live.idempotency_key = todos.idempotency_key
           AND live.id <> todos.id AND {{live(live.state)}}) AS live_twin,
       (SELECT holder.id FROM todos AS holder
         WHERE holder.concurrency_key = todos.concurrency_key AND holder.state = 'claimed'
           AND holder.id <> todos.id) AS key_holder,
       (SELECT settings.paused AND (settings.resume_at IS NULL OR settings.resume_at > now())
          FROM todo_queues AS settings WHERE settings.name = todos.queue) AS queue_paused,
       (SELECT {{room_of(settings)}}
          FROM todo_queues AS settings WHERE settings.name = todos.queue) AS queue_room
  FROM todos
 WHERE id = ANY (%(ids)s::text[]);
