-- Every transition of the todo state machine, one guarded statement each.
--
-- Format: a block starts at "-- name: <operation>" (the TodoManager method of the same name)
-- and runs to the next such line; its first comment line is the contract. Parameters are
-- named, %(name)s. Time is always the database's now(): the application's clock never
-- decides a lease. A statement that returns no row missed its guard, and the manager
-- classifies the miss (TodoNotFound or TodoConflict). Each statement that writes todos has its
-- row in transitions.py, whose from-states are the states its guard tests (a test holds them).
--
-- When a todo becomes claimable: a pending todo with no next_retry_at at created_at, one with
-- a next_retry_at at that time, and a claimed todo whose lease lapsed at lease_expires_at.
-- Claims take the highest priority first and, within a priority, the longest-claimable first,
-- so a retried todo queues behind work that was already waiting, as a message that becomes
-- visible again does in SQS.
--
-- A statement that makes todos claimable right now also sends NOTIFY switchboard_todos with the
-- queue name as payload, once per queue and statement (never per row), so that listening
-- workers wake at once; %(notify)s (SWITCHBOARD_TODOS_LISTEN) turns that off. NOTIFY is
-- transactional: it is delivered when the caller's transaction commits, and not at all if it
-- rolls back. The "notified" CTE runs only because the final query references it, hence the
-- always-true "WHERE (SELECT count(*) FROM notified) >= 0".
--
-- What several statements share is written once, as a fragment: "-- fragment: x(a, b)" defines
-- it, "{{x(value, value)}}" places it, $a in its body stands for the value given (sql/__init__.py
-- composes them when the file is loaded).

-- fragment: live(state)
-- A todo that holds its idempotency key: pending or claimed, neither done nor failed. This is
-- the predicate of idx_todos_dedupe; `state` is the column, qualified as the statement needs.
$state <> 'done' AND $state <> 'failed'

-- fragment: key_free(todo)
-- `todo` (a row of todos) has no concurrency key, or no other claimed todo holds its key. The
-- database settles two claims that both saw the key free: idx_todos_key_claimed lets only one
-- claimed todo hold a key, and the claim that loses runs again (managers.py).
($todo.concurrency_key IS NULL OR NOT EXISTS (
     SELECT FROM todos AS holder
      WHERE holder.concurrency_key = $todo.concurrency_key AND holder.state = 'claimed'
        AND holder.id <> $todo.id))

-- fragment: key_head(todo)
-- `todo` (a ready row of todos) has no concurrency key, or no ready todo with its key comes
-- before it (higher priority, then older, then lower id): so the todos of one key are claimed
-- in order, even while a concurrent claim holds the first one locked (idx_todos_key_order).
($todo.concurrency_key IS NULL OR NOT EXISTS (
     SELECT FROM todos AS earlier
      WHERE earlier.concurrency_key = $todo.concurrency_key AND earlier.state = 'pending'
        AND earlier.next_retry_at IS NULL
        AND (-earlier.priority, earlier.created_at, earlier.id)
            < (-$todo.priority, $todo.created_at, $todo.id)))

-- fragment: ready_scan(queue, priorities, mark)
-- The claim's scan of the ready todos of `queue` at the `priorities` (a condition on the
-- column), from `mark` on: in claim order, each locked as it is read, under the constant
-- limit explained at claim_next. With a fixed priority, the B-tree seeks to the mark.
SELECT * FROM (
    SELECT id, priority, concurrency_key, created_at
      FROM todos
     WHERE state = 'pending' AND next_retry_at IS NULL
       AND queue = $queue AND $priorities
       AND created_at >= $mark
       AND (assignee IS NULL OR assignee = (SELECT %(owner)s::text))
       AND {{key_free(todos)}} AND {{key_head(todos)}}
     ORDER BY priority DESC, created_at
     LIMIT 1000
       FOR UPDATE SKIP LOCKED
) AS scan

-- fragment: picked
-- The "first_per_key" and "picked" CTEs of a claim: of the candidates of its ready, due and
-- lapsed scans, the first %(limit)s by priority, then claimable time, taking one todo at most
-- per concurrency key and no more from a queue than its room (the "room" CTE); with
-- %(max_held)s, only as many as bring the todos %(owner)s holds up to it (counted only then, on
-- idx_todos_held). `in_queue` numbers the picks of each queue in the room CTE in claim order
-- (NULL elsewhere). The candidates without a key, and those of queues nothing limits, skip the
-- window that would number them: the common claim sorts its candidates once.
first_per_key AS MATERIALIZED (
    SELECT id, queue, priority, claimable_at
      FROM (SELECT * FROM ready UNION ALL SELECT * FROM due UNION ALL SELECT * FROM lapsed)
           AS claimable
     WHERE concurrency_key IS NULL
    UNION ALL
    SELECT id, queue, priority, claimable_at
      FROM (SELECT *, row_number() OVER (PARTITION BY concurrency_key
                                         ORDER BY priority DESC, claimable_at) AS nth
              FROM (SELECT * FROM ready UNION ALL SELECT * FROM due
                    UNION ALL SELECT * FROM lapsed) AS claimable
             WHERE concurrency_key IS NOT NULL
           ) AS keyed
     WHERE nth = 1
),
picked AS MATERIALIZED (
    SELECT id, queue, priority, claimable_at, in_queue
      FROM (SELECT *, NULL::bigint AS in_queue
              FROM first_per_key
             WHERE queue NOT IN (SELECT queue FROM room)
            UNION ALL
            SELECT *
              FROM (SELECT *, row_number() OVER (PARTITION BY queue
                                                 ORDER BY priority DESC, claimable_at) AS in_queue
                      FROM first_per_key
                     WHERE queue IN (SELECT queue FROM room)
                   ) AS limited
             WHERE in_queue <= coalesce((SELECT room.room FROM room
                                          WHERE room.queue = limited.queue), in_queue)
           ) AS per_queue
     ORDER BY priority DESC, claimable_at
     LIMIT (SELECT CASE WHEN (SELECT %(max_held)s::int) IS NULL THEN %(limit)s::int
                   ELSE greatest(0, least(%(limit)s::int, (SELECT %(max_held)s::int) - (
                            SELECT count(*) FROM todos AS held
                             WHERE held.state = 'claimed' AND held.owner = %(owner)s)::int))
                   END)
)

-- fragment: rate_window(settings)
-- Where the current window of `settings`' (a todo_queues row) rate limit began: windows are
-- rate_period long and counted from the Unix epoch, so that every claimer agrees on them.
to_timestamp(floor(extract(epoch FROM now()) / extract(epoch FROM $settings.rate_period))
             * extract(epoch FROM $settings.rate_period))

-- fragment: room_of(settings)
-- How many more todos of `settings`' queue (a todo_queues row) may be claimed now: none while
-- it is paused (until its resume_at), else what its rate limit leaves of the current window
-- and its concurrency limit leaves of its slots (claimed todos holding one); NULL: no limit.
-- The current window is this statement's (its now()): a claim that began in a window that a
-- later claim has since closed (it waited for the row meanwhile) takes nothing, as that
-- window's count is gone.
CASE WHEN $settings.paused AND ($settings.resume_at IS NULL OR $settings.resume_at > now())
     THEN 0
     WHEN $settings.rate_limit IS NULL AND $settings.concurrency_limit IS NULL THEN NULL
     ELSE greatest(0, least(
         $settings.rate_limit - CASE WHEN $settings.rate_window = {{rate_window($settings)}}
                                     THEN $settings.rate_count
                                     WHEN $settings.rate_window > {{rate_window($settings)}}
                                     THEN $settings.rate_limit
                                     ELSE 0 END,
         $settings.concurrency_limit - (
             SELECT count(*) FROM todos AS holder
              WHERE holder.queue = $settings.name AND holder.state = 'claimed'
                AND holder.slot IS NOT NULL)::int))
END

-- fragment: room(queues)
-- The "room" CTE of a claim: each queue of `queues` (a text[]) whose todo_queues row pauses or
-- limits it, with how many todos this claim may take from it (room_of). Those rows are
-- locked, so the claims of a limited queue run one at a time, and each reads the row as the
-- one before it left it (the rate count), even if it changed after this statement began.
-- Queues without such a row are not here: nothing limits them, and nothing is locked.
room AS MATERIALIZED (
    SELECT settings.name AS queue, settings.concurrency_limit, settings.slot_cursor,
           {{room_of(settings)}} AS room
      FROM todo_queues AS settings
     WHERE settings.name = ANY ($queues)
       AND (settings.paused OR settings.rate_limit IS NOT NULL
            OR settings.concurrency_limit IS NOT NULL)
       FOR NO KEY UPDATE
)

-- fragment: slot(limit)
-- The "free_slot" and "slot" CTEs of a claim: for each todo picked from a queue with a
-- concurrency limit, a free slot (1 to the limit) that no claimed todo of the queue holds. The
-- free slots are found once per queue, probing the index for each number only until the claim
-- has as many as it may take (at most `limit`); the picks take them in turn (in_queue).
-- The probe starts at the queue's slot_cursor, where the claim before it stopped (counted
-- moves it), and goes round: the claims of a limited queue run one at a time (room), but each
-- reads the claimed todos in the snapshot it began with, blind to the slots the claim it
-- waited for took; from slot 1 on, it picked those again, hit idx_todos_slot, and ran again
-- (managers.py), as two claims racing for a concurrency key do. `step` counts from 0 round
-- the ring of slots, from where the queue's cursor was.
free_slot AS MATERIALIZED (
    SELECT room.queue, free.step, free.slot, row_number() OVER (PARTITION BY room.queue) AS nth
      FROM room
     CROSS JOIN LATERAL (
            SELECT step, ring.slot
              FROM generate_series(0, room.concurrency_limit - 1) AS step
             CROSS JOIN LATERAL (
                    SELECT mod(room.slot_cursor + step, room.concurrency_limit) + 1 AS slot
                   ) AS ring
             WHERE NOT EXISTS (
                    SELECT FROM todos AS holder
                     WHERE holder.queue = room.queue AND holder.state = 'claimed'
                       AND holder.slot = ring.slot)
             LIMIT least(room.room, $limit)
           ) AS free
     WHERE room.concurrency_limit IS NOT NULL
),
slot AS MATERIALIZED (
    SELECT picked.id, free_slot.step, free_slot.slot
      FROM picked
      JOIN free_slot ON free_slot.queue = picked.queue AND free_slot.nth = picked.in_queue
)

-- fragment: counted
-- The "counted" CTE of a claim: the todos it claimed from each rate-limited queue added to its
-- rate window's count (a new window starts again from zero), unless a later claim has closed
-- the window this one began in; and the slot cursor of each queue with a concurrency limit
-- moved past the last slot it took (the "slot" CTE).
counted AS (
    UPDATE todo_queues AS settings
       SET rate_count = CASE WHEN NOT {{counts_rate(settings)}} THEN settings.rate_count
                             WHEN settings.rate_window = {{rate_window(settings)}}
                             THEN settings.rate_count + claims.count
                             ELSE claims.count END,
           rate_window = CASE WHEN {{counts_rate(settings)}} THEN {{rate_window(settings)}}
                              ELSE settings.rate_window END,
           slot_cursor = coalesce(mod(settings.slot_cursor + claims.last_step + 1,
                                      settings.concurrency_limit), settings.slot_cursor)
      FROM (SELECT claimed.queue, count(*) AS count, max(slot.step) AS last_step
              FROM claimed
              LEFT JOIN slot ON slot.id = claimed.id
             WHERE claimed.queue IN (SELECT queue FROM room)
             GROUP BY claimed.queue) AS claims
     WHERE settings.name = claims.queue
       AND ({{counts_rate(settings)}} OR claims.last_step IS NOT NULL)
)

-- fragment: counts_rate(settings)
-- Whether a claim adds what it took to the rate window of `settings` (a todo_queues row): the
-- queue has a rate limit, and no later claim has closed the window this statement is in.
($settings.rate_limit IS NOT NULL
 AND ($settings.rate_window IS NULL OR $settings.rate_window <= {{rate_window($settings)}}))

-- fragment: todo_columns(todo)
-- Every column of `todo`, in the model's order: what a statement returns when its branches must
-- agree (created_or_held), which `*` (the table's physical order) does not promise.
$todo.id, $todo.queue, $todo.source, $todo.kind, $todo.title, $todo.payload, $todo.event_id,
$todo.idempotency_key, $todo.assignee, $todo.state, $todo.owner, $todo.lease_expires_at,
$todo.attempt, $todo.max_attempts, $todo.priority, $todo.concurrency_key, $todo.slot,
$todo.next_retry_at, $todo.result, $todo.errors, $todo.errors_dropped, $todo.progress,
$todo.awaited, $todo.parents, $todo.waiting_for, $todo.on_parent_failure, $todo.children,
$todo.created_at, $todo.updated_at, $todo.claimed_at, $todo.completed_at

-- fragment: created_columns(todo)
-- todo_columns of a todo just inserted, with NULL for the values its creator gave and for those
-- every new todo starts with (read as sql.CREATED_NULLS; the manager fills the first in from its
-- own parameters and the second, sql.CREATED_FRESH, from the columns' defaults): a create sends
-- back only what the database decided. `todo` holds inserted_columns.
$todo.id, NULL::text AS queue, NULL::text AS source, NULL::text AS kind, NULL::text AS title,
NULL::jsonb AS payload, NULL::text AS event_id, NULL::text AS idempotency_key,
NULL::text AS assignee, NULL::text AS state, NULL::text AS owner,
NULL::timestamptz AS lease_expires_at, NULL::int AS attempt, $todo.max_attempts,
NULL::smallint AS priority, NULL::text AS concurrency_key, NULL::smallint AS slot,
$todo.next_retry_at, NULL::jsonb AS result, NULL::jsonb AS errors, NULL::int AS errors_dropped,
NULL::jsonb AS progress, NULL::boolean AS awaited, $todo.parents, $todo.waiting_for,
$todo.on_parent_failure, $todo.children, $todo.created_at, $todo.updated_at,
NULL::timestamptz AS claimed_at, NULL::timestamptz AS completed_at

-- fragment: inserted_columns
-- What the "inserted" CTE of a create returns: the columns of created_columns, and the queue
-- (its notification). Not `*`: the rest would be stored for the answer and never read.
id, queue, max_attempts, next_retry_at, parents, waiting_for, on_parent_failure, children,
created_at, updated_at

-- fragment: created_then_held
-- The answer of a create, after its "notified" CTE has run: the todos of "inserted" (created),
-- then the rows of `todos` that the FROM and WHERE clauses following it pick (the live todos
-- holding the keys of those not inserted).
SELECT {{created_columns(inserted)}}, true AS created
  FROM inserted
 WHERE (SELECT count(*) FROM notified) >= 0
UNION ALL
SELECT {{todo_columns(todos)}}, false AS created
  FROM todos

-- fragment: created_or_held
-- The end of a statement that creates one todo (its "inserted" CTE): the notification of a new
-- claimable todo, and the answer: the todo inserted (created, without the values its creator
-- gave: created_columns), or else the live todo that holds (%(queue)s, %(idempotency_key)s)
-- (not created), whole.
{{notified(inserted WHERE next_retry_at IS NULL AND %(notify)s)}}
{{created_then_held}}
 WHERE queue = %(queue)s
   AND idempotency_key = %(idempotency_key)s
   AND {{live(state)}}
   AND NOT EXISTS (SELECT FROM inserted)

-- fragment: created_or_held_many
-- created_or_held for a batch (its "batch" and "inserted" CTEs): one notification per queue,
-- and the todos inserted (created, without what their creator gave) beside the live todos that
-- hold the keys of those that were not (not created), whole.
{{notified_per_queue(inserted WHERE next_retry_at IS NULL AND %(notify)s)}}
{{created_then_held}}
  JOIN batch ON todos.queue = batch.queue AND todos.idempotency_key = batch.idempotency_key
 WHERE {{live(todos.state)}}
   AND batch.id NOT IN (SELECT id FROM inserted)

-- fragment: batch_rows(given)
-- The FROM item of a batch of new todos, `given` (fields, payload): %(rows)s, a JSON array of
-- one array per todo of its column values (batch_columns), zipped with %(payloads)s, a JSON
-- array of their payloads. Two values, not an array per column: psycopg escapes each element of
-- an array in Python, which cost more than the insert itself.
ROWS FROM (jsonb_array_elements(%(rows)s::jsonb), jsonb_array_elements(%(payloads)s::jsonb))
    AS $given (fields, payload)

-- fragment: batch_columns(given)
-- The columns of a new todo of batch_rows `given`, by their place in its array of values.
$given.fields ->> 0 AS id, $given.fields ->> 1 AS queue, $given.fields ->> 2 AS source,
$given.fields ->> 3 AS kind, $given.fields ->> 4 AS title, $given.payload,
$given.fields ->> 5 AS event_id, $given.fields ->> 6 AS idempotency_key,
$given.fields ->> 7 AS assignee, ($given.fields ->> 8)::int AS max_attempts,
($given.fields ->> 9)::smallint AS priority, $given.fields ->> 10 AS concurrency_key,
($given.fields ->> 11)::timestamptz AS run_after

-- fragment: waited(parent)
-- How many of the rows of `parent` (a FROM item of id, state: parents locked and read as they
-- are now) a new todo waits for: those neither done nor failed.
count(*) FILTER (WHERE $parent.state IN ('pending', 'claimed'))

-- fragment: usable(parent, wanted)
-- Whether the parents a new todo names (`wanted`, a text[]) all exist, and none is a dead letter:
-- a todo does not wait for what will never be done (requeue it first).
count(*) = cardinality($wanted) AND count(*) FILTER (WHERE $parent.state = 'failed') = 0

-- fragment: parents_locked(ids)
-- The "parent" CTE of a creation: the existing todos in `ids` (a text[]) a new todo waits for,
-- locked in id order (two creators of children of one parent take turns, never deadlock; a
-- statement finishing one waits, then sees the child: children_seen) and read as they are now.
parent AS MATERIALIZED (
    SELECT id, state
      FROM todos
     WHERE id = ANY ($ids)
     ORDER BY id
       FOR NO KEY UPDATE
)

-- fragment: parents_shared(name, todos)
-- The `name` CTE: the parents of the todos in `todos` (a CTE of ids) that are not among them,
-- locked FOR SHARE in id order and read as they are now, to count what those todos wait for:
-- a statement completing one of them waits for this one, then sees what it brought back.
$name AS MATERIALIZED (
    SELECT id, state
      FROM todos
     WHERE id = ANY (ARRAY(SELECT unnest(parents) FROM todos
                            WHERE id IN (SELECT id FROM $todos) AND parents IS NOT NULL))
       AND id NOT IN (SELECT id FROM $todos)
     ORDER BY id
       FOR SHARE
)

-- fragment: waiting_again(todo, back, parent)
-- How many parents the todo `todo` (an id) waits for as it is brought back: those brought back
-- with it (`back`, a SELECT of ids), and of its other parents (`parent`, parents_shared) those
-- neither done nor failed.
(SELECT count(*)
   FROM unnest(coalesce((SELECT t.parents FROM todos AS t WHERE t.id = $todo), '{}'))
        AS edge (id)
  WHERE edge.id IN ($back)
     OR edge.id IN (SELECT id FROM $parent WHERE state IN ('pending', 'claimed')))

-- fragment: revived(requeued)
-- The "revived_set", "revived_parent" and "revived" CTEs: the todos cancelled because a todo of
-- `requeued` (just brought back) failed, and in turn those cancelled because they were
-- (result "ParentFailed", its "parent"), pending again with a fresh attempt budget, waiting
-- again for their parents not done (waiting_again): blocked, or due now.
revived_set AS MATERIALIZED (
    WITH RECURSIVE below (id, children) AS (
        SELECT child.id, child.children
          FROM $requeued
         CROSS JOIN LATERAL unnest($requeued.children) AS edge (id)
          JOIN todos AS child ON child.id = edge.id
         WHERE child.state = 'failed' AND child.result ->> 'type' = 'ParentFailed'
           AND child.result ->> 'parent' = $requeued.id
        UNION
        SELECT child.id, child.children
          FROM below
         CROSS JOIN LATERAL unnest(below.children) AS edge (id)
          JOIN todos AS child ON child.id = edge.id
         WHERE child.state = 'failed' AND child.result ->> 'type' = 'ParentFailed'
           AND child.result ->> 'parent' = below.id
    )
    SELECT DISTINCT id FROM below
),
revived_back AS MATERIALIZED (
    SELECT id FROM revived_set UNION SELECT id FROM $requeued
),
{{parents_shared(revived_parent, revived_back)}},
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
)

-- fragment: blocked
-- The next_retry_at of a todo that waits for others: later than any claim will look, and
-- still a date Python can read (year 9999, not 'infinity').
'9999-01-01 00:00:00+00'::timestamptz

-- fragment: children_seen(todo)
-- `todo` (the row a statement is about to finish) has no children, or the same ones as in this
-- statement's snapshot. A todo created as its child while the statement waited for the row
-- lock (the creator locks its parents) is not visible to the statement, which could then not
-- unblock or settle it: re-checked on the row as it is now, the guard fails, the statement
-- leaves the row alone, and the manager runs it again, seeing the child. A todo without
-- children pays the IS NULL test only.
($todo.children IS NULL
 OR $todo.children = (SELECT seen.children FROM todos AS seen WHERE seen.id = $todo.id))

-- fragment: unblocked(edges)
-- The "waiting" and "unblocked" CTEs: each todo named by a `child_id` of `edges` (a FROM item,
-- one row per parent of it that just finished: done, or a dead letter it runs anyway after)
-- counts that many parents fewer, and one left with none becomes due now, claimable as a new
-- todo is. The children are locked in id order first, so that two statements finishing parents
-- of the same children never deadlock; of 8 parents of one child finishing at once, each
-- decrement sees the one before. Their state is tested on the rows as they are now (in SET,
-- not in the scans), so that a child a concurrent requeue has just brought back is counted.
waiting AS MATERIALIZED (
    SELECT id
      FROM todos
     WHERE id = ANY (ARRAY(SELECT child_id FROM $edges))
     ORDER BY id
       FOR NO KEY UPDATE
),
unblocked AS (
    UPDATE todos AS child
       SET waiting_for = CASE WHEN child.state = 'pending' AND child.waiting_for > 0
                              THEN child.waiting_for - edge.count ELSE child.waiting_for END,
           next_retry_at = CASE WHEN child.state = 'pending' AND child.waiting_for > 0
                                 AND child.waiting_for - edge.count <= 0 THEN now()
                                ELSE child.next_retry_at END,
           updated_at = now()
      FROM (SELECT child_id, count(*) AS count FROM $edges GROUP BY child_id) AS edge
     WHERE child.id = edge.child_id AND child.id IN (SELECT id FROM waiting)
    RETURNING child.id, child.queue, child.state, child.waiting_for, child.next_retry_at
)

-- fragment: parent_failed(parent)
-- The result and error of a todo that was cancelled because `parent`, which it waited for (or
-- waited for through others), ended as a dead letter; requeue reads "parent" back.
jsonb_build_object('type', 'ParentFailed', 'parent', $parent,
    'message', 'Todo ' || $parent || ', which this todo waited for, ended as a dead letter.')

-- fragment: settled(fallen)
-- The "lost", "held_below", "cancelled_below", "waiting" and "unblocked" CTEs: what becomes of
-- the todos waiting for those of `fallen` (a FROM item of rows with id and children, just made
-- dead letters). Each that is to be cancelled with its parent (on_parent_failure 'cancel')
-- becomes a dead letter saying which parent failed, and so do, in turn, those waiting for it;
-- each that runs anyway counts the failed parent as finished (unblocked). All of them are
-- locked in id order first.
lost AS MATERIALIZED (
    WITH RECURSIVE below (id, children, parent) AS (
        SELECT child.id, child.children, gone.id
          FROM (SELECT id, children FROM $fallen) AS gone
         CROSS JOIN LATERAL unnest(gone.children) AS edge (id)
          JOIN todos AS child ON child.id = edge.id
         WHERE child.state = 'pending' AND child.on_parent_failure = 'cancel'
        UNION
        SELECT child.id, child.children, below.id
          FROM below
         CROSS JOIN LATERAL unnest(below.children) AS edge (id)
          JOIN todos AS child ON child.id = edge.id
         WHERE child.state = 'pending' AND child.on_parent_failure = 'cancel'
    )
    SELECT DISTINCT ON (id) id, children, parent FROM below ORDER BY id, parent
),
spared AS MATERIALIZED (
    SELECT child.id AS child_id
      FROM (SELECT id, children FROM $fallen UNION ALL SELECT id, children FROM lost) AS gone
     CROSS JOIN LATERAL unnest(gone.children) AS edge (id)
      JOIN todos AS child ON child.id = edge.id
     WHERE child.on_parent_failure = 'run_anyway'
),
held_below AS MATERIALIZED (
    SELECT id
      FROM todos
     WHERE id = ANY (ARRAY(SELECT id FROM lost UNION SELECT child_id FROM spared))
     ORDER BY id
       FOR NO KEY UPDATE
),
cancelled_below AS (
    UPDATE todos
       SET state = 'failed', next_retry_at = NULL, completed_at = now(), updated_at = now(),
           result = {{parent_failed(lost.parent)}},
           errors = {{errors_with(NULL, {{parent_failed(lost.parent)}})}},
           errors_dropped = {{errors_dropped_with}}
      FROM lost
     WHERE todos.id = lost.id AND todos.id IN (SELECT id FROM held_below)
       AND todos.state = 'pending'
    RETURNING todos.id, todos.awaited
),
{{unblocked(spared)}}

-- fragment: unless_key_held
-- An insert skips a todo whose (queue, idempotency_key) a live todo holds (idx_todos_dedupe).
ON CONFLICT (queue, idempotency_key)
   WHERE idempotency_key IS NOT NULL AND {{live(state)}}
DO NOTHING

-- fragment: notified(claimable)
-- The "notified" CTE: wakes the workers of each queue in `claimable`, a FROM item of the rows
-- the statement made claimable now, filtered with %(notify)s.
notified AS (
    SELECT pg_notify('switchboard_todos', queue)
      FROM $claimable
)

-- fragment: notified_per_queue(claimable)
-- The "notified" CTE of a statement that changes many rows: one notification per queue.
{{notified((SELECT DISTINCT queue FROM $claimable) AS claimable)}}

-- fragment: finished(ended)
-- The "finished" CTE: tells whoever waits for one of the todos of `ended` (a FROM item of todos
-- that just became done or failed, with id and awaited) that it ended: NOTIFY
-- switchboard_todos_done with its id, only for a todo someone marked awaited (wait_for), so that
-- the others cost nothing but the test. Like "notified", it runs because the final query
-- references it.
finished AS (
    SELECT pg_notify('switchboard_todos_done', id)
      FROM $ended
)

-- fragment: errors_with(owner, error)
-- The failure history (`errors`) with one more entry: the attempt that ended, who held it, when
-- it was claimed and when it ended, and `error`, an object with "type" and "message" (trimmed
-- to SWITCHBOARD_TODOS_MAX_ERROR_BYTES before the statement). Only the last
-- %(max_errors_kept)s entries are kept; errors_dropped_with counts the ones this drops, and
-- every statement that writes one writes the other.
jsonb_path_query_array(
    errors || jsonb_build_array(jsonb_build_object(
        'attempt', attempt, 'owner', $owner, 'claimed_at', claimed_at, 'at', now(),
        'error', $error)),
    '$[last - $kept + 1 to last]', jsonb_build_object('kept', %(max_errors_kept)s::int))

-- fragment: errors_dropped_with
-- `errors_dropped` plus the entries errors_with drops from the history, in the same SET.
errors_dropped + greatest(0, jsonb_array_length(errors) + 1 - %(max_errors_kept)s::int)

-- fragment: lease_expired
-- The error of an attempt whose lease lapsed: recorded by the reaper, or the claim taking over.
jsonb_build_object('type', 'LeaseExpired',
    'message', 'The lease lapsed before complete, fail or release.')

-- fragment: cancelled
-- The error of a todo an operator cancelled (cancel), with %(reason)s as its message.
jsonb_build_object('type', 'Cancelled', 'message', %(reason)s::text)

-- fragment: cancelled_hold(todo)
-- `todo` was cancelled by an operator while its owner held it: a dead letter whose result is
-- the cancel's error and which, alone of the dead letters, keeps its owner (fail, the reaper
-- and requeue clear it), so that the holder can be told "cancelled" rather than "not yours".
($todo.state = 'failed' AND $todo.owner IS NOT NULL AND $todo.result ->> 'type' = 'Cancelled')

-- fragment: lease_end(todo)
-- When the lease a claim or heartbeat gives `todo` ends: %(ttl)s from now, or, when the caller
-- gave none, its queue's visibility timeout (todo_queues), else %(default_ttl)s
-- (SWITCHBOARD_TODOS_DEFAULT_TTL). The queue's row is read only when no ttl was given. The ttl
-- is read through "(SELECT ...)", as the claim's other parameters are (claim_next): a planner
-- that saw it given would drop the lookup from a custom plan, whose cost would then stay below
-- the generic plan's, and PostgreSQL would plan the prepared claim anew at every call.
now() + coalesce((SELECT %(ttl)s::interval),
                 (SELECT settings.visibility_timeout FROM todo_queues AS settings
                   WHERE settings.name = $todo.queue),
                 %(default_ttl)s::interval)

-- fragment: set_claimed
-- What a claim writes: the lease to %(owner)s (lease_end), one more attempt, its slot in a
-- queue with a concurrency limit (the "slot" CTE). A claim that takes over a lapsed lease
-- records the lapsed attempt in the failure history. The slots are gathered once into a JSON
-- object, id to slot, that each row looks itself up in: a subquery over "slot" per row read
-- the whole CTE for each todo claimed, a cost that grew with the square of the batch.
SET state = 'claimed',
    owner = %(owner)s,
    lease_expires_at = {{lease_end(todos)}},
    attempt = attempt + 1,
    claimed_at = now(),
    next_retry_at = NULL,
    errors = CASE WHEN state = 'claimed' THEN {{errors_with(owner, {{lease_expired}})}}
             ELSE errors END,
    errors_dropped = CASE WHEN state = 'claimed' THEN {{errors_dropped_with}}
                     ELSE errors_dropped END,
    slot = ((SELECT jsonb_object_agg(slot.id, slot.slot) FROM slot) ->> todos.id)::smallint,
    updated_at = now()

-- fragment: max_attempts_of(given, queue)
-- A new todo's attempt budget: `given`, or when the caller gave none (NULL), the default of its
-- queue `queue` (todo_queues.max_attempts), else %(default_max_attempts)s. The queue's row is
-- read only when none was given: COALESCE evaluates an argument only when those before it
-- are NULL.
coalesce($given,
         (SELECT settings.max_attempts FROM todo_queues AS settings WHERE settings.name = $queue),
         %(default_max_attempts)s::int)

-- fragment: purged
-- The end of a purge: delete the todos its "doomed" CTE picked, and count them per queue and
-- state with the newest completed_at of each (where the next batch starts). = ANY(ARRAY(...)),
-- not IN (SELECT ...): an array is probed through the primary key; a semi-join may be planned
-- as a hash join over a scan of the whole table.
deleted AS (
    DELETE FROM todos
     WHERE id = ANY (ARRAY(SELECT id FROM doomed))
    RETURNING queue, state, completed_at
)
SELECT queue, state, count(*) AS deleted, max(completed_at) AS newest
  FROM deleted
 GROUP BY queue, state

-- name: create_todo
-- Insert a pending todo, or return the live todo that already holds (queue, idempotency_key).
-- Without %(max_attempts)s (NULL), the todo takes its queue's default (max_attempts_of).
WITH inserted AS (
    INSERT INTO todos (queue, source, kind, title, payload, event_id, idempotency_key,
                       assignee, max_attempts, priority, concurrency_key, next_retry_at)
    VALUES (%(queue)s, %(source)s, %(kind)s, %(title)s, %(payload)s::jsonb, %(event_id)s,
            %(idempotency_key)s, %(assignee)s,
            {{max_attempts_of(%(max_attempts)s::int, %(queue)s)}},
            %(priority)s, %(concurrency_key)s,
            CASE WHEN %(run_after)s::timestamptz > now() THEN %(run_after)s::timestamptz END)
    {{unless_key_held}}
    RETURNING {{inserted_columns}}
),
{{created_or_held}};

-- name: create_child
-- Insert a pending todo %(id)s that waits for the todos %(parents)s, or return the live todo that
-- already holds (queue, idempotency_key). The parents are locked and read as they are now
-- (parents_locked): the todo waits for those neither done nor failed, and is not claimable
-- while it waits (next_retry_at in the year 9999, the "blocked" fragment: at the end of
-- idx_todos_scheduled, where no claim's scan of due todos reaches). Once inserted, it is added
-- to each parent's children. Nothing is written when a parent is missing or a dead letter: the
-- manager says which. Without %(max_attempts)s, the queue's default (max_attempts_of).
WITH {{parents_locked(%(parents)s::text[])}},
waiting AS MATERIALIZED (
    SELECT {{waited(parent)}} AS count
      FROM parent
    HAVING {{usable(parent, %(parents)s::text[])}}
),
inserted AS (
    INSERT INTO todos (id, queue, source, kind, title, payload, event_id, idempotency_key,
                       assignee, max_attempts, priority, concurrency_key, parents, waiting_for,
                       on_parent_failure, next_retry_at)
    SELECT %(id)s, %(queue)s, %(source)s, %(kind)s, %(title)s, %(payload)s::jsonb, %(event_id)s,
           %(idempotency_key)s, %(assignee)s,
           {{max_attempts_of(%(max_attempts)s::int, %(queue)s)}},
           %(priority)s, %(concurrency_key)s, %(parents)s::text[], waiting.count,
           %(on_parent_failure)s, CASE WHEN waiting.count > 0 THEN {{blocked}} END
      FROM waiting
    {{unless_key_held}}
    RETURNING {{inserted_columns}}
),
linked AS (
    UPDATE todos
       SET children = coalesce(todos.children, '{}') || inserted.id, updated_at = now()
      FROM inserted
     WHERE todos.id IN (SELECT id FROM parent)
),
{{created_or_held}};

-- name: create_many
-- Insert many pending todos at once. The answer is one row of what the database decided: its
-- now() (each new todo's created_at and updated_at), the default max_attempts of each queue a
-- row gave none for (defaults: {queue: max_attempts} of the queues that have a row in
-- todo_queues; the others take %(default_max_attempts)s), the ids of the rows with a key that
-- were not inserted (missed), which the manager looks up, and the ids of those inserted with a
-- next_retry_at (a run_after still ahead) beside it. The manager builds the new todos from
-- what it sent: returned, a batch of 1,000 cost more to send and read than to insert. (The
-- live todos holding the missed keys are not joined in: a generic plan made while `todos`
-- was nearly empty hashed a sequential scan of it, and every batch read the whole table.)
WITH batch AS (
    SELECT {{batch_columns(given)}}
      FROM {{batch_rows(given)}}
),
defaults AS MATERIALIZED (
    SELECT settings.name, settings.max_attempts
      FROM todo_queues AS settings
     WHERE settings.name IN (SELECT queue FROM batch WHERE max_attempts IS NULL)
),
inserted AS (
    INSERT INTO todos (id, queue, source, kind, title, payload, event_id, idempotency_key,
                       assignee, max_attempts, priority, concurrency_key, next_retry_at)
    SELECT batch.id, batch.queue, source, kind, title, payload, event_id, idempotency_key,
           assignee,
           coalesce(batch.max_attempts, defaults.max_attempts, %(default_max_attempts)s::int),
           priority, concurrency_key, CASE WHEN run_after > now() THEN run_after END
      FROM batch
      LEFT JOIN defaults ON defaults.name = batch.queue
    {{unless_key_held}}
    RETURNING id, queue, next_retry_at
),
{{notified_per_queue(inserted WHERE next_retry_at IS NULL AND %(notify)s)}}
SELECT now() AS now,
       (SELECT jsonb_object_agg(name, max_attempts) FROM defaults) AS defaults,
       ARRAY(SELECT id
               FROM batch
              WHERE idempotency_key IS NOT NULL
                AND id NOT IN (SELECT id FROM inserted)) AS missed,
       scheduled.ids AS scheduled, scheduled.next_retry_at
  FROM (SELECT array_agg(id) AS ids, array_agg(next_retry_at) AS next_retry_at
          FROM inserted
         WHERE next_retry_at IS NOT NULL) AS scheduled
 WHERE (SELECT count(*) FROM notified) >= 0;

-- name: create_graph
-- Insert many todos, some waiting for others of the batch or for existing todos: the whole
-- batch or nothing (the manager runs it in a transaction, and rolls it back when a member's key
-- is held by a live todo). Each row gives, after create_many's columns (batch_rows), its parents
-- (a JSON array of ids), how many of them are members (new, so not done), its children among
-- the members (ids), and its policy. The
-- existing parents, %(existing)s, are locked and read as they are now, as create_child does;
-- nothing is inserted when one is missing or a dead letter. A row without max_attempts takes
-- its queue's default (max_attempts_of).
WITH batch AS (
    SELECT {{batch_columns(given)}}, given.fields -> 12 AS parents,
           (given.fields ->> 13)::int AS members_waited, given.fields -> 14 AS children,
           given.fields ->> 15 AS policy
      FROM {{batch_rows(given)}}
),
{{parents_locked(%(existing)s::text[])}},
usable AS MATERIALIZED (
    SELECT {{usable(parent, %(existing)s::text[])}} AS ok
      FROM parent
),
inserted AS (
    INSERT INTO todos (id, queue, source, kind, title, payload, event_id, idempotency_key,
                       assignee, max_attempts, priority, concurrency_key, parents, waiting_for,
                       on_parent_failure, children, next_retry_at)
    SELECT batch.id, queue, source, kind, title, payload, event_id, idempotency_key, assignee,
           {{max_attempts_of(batch.max_attempts, batch.queue)}}, priority, concurrency_key,
           nullif(ARRAY(SELECT jsonb_array_elements_text(batch.parents)), '{}'),
           members_waited + waiting.existing, policy,
           nullif(ARRAY(SELECT jsonb_array_elements_text(batch.children)), '{}'),
           CASE WHEN members_waited + waiting.existing > 0 THEN {{blocked}} END
      FROM batch
     CROSS JOIN LATERAL (
            SELECT {{waited(parent)}} AS existing
              FROM parent
             WHERE parent.id IN (SELECT jsonb_array_elements_text(batch.parents))
           ) AS waiting
     WHERE (SELECT ok FROM usable)
    {{unless_key_held}}
    RETURNING {{inserted_columns}}
),
linked AS (
    UPDATE todos
       SET children = coalesce(todos.children, '{}') || new.children, updated_at = now()
      FROM (SELECT edge.parent_id, array_agg(inserted.id ORDER BY inserted.id) AS children
              FROM inserted
             CROSS JOIN LATERAL unnest(inserted.parents) AS edge (parent_id)
             WHERE edge.parent_id IN (SELECT id FROM parent)
             GROUP BY edge.parent_id) AS new
     WHERE todos.id = new.parent_id
),
{{created_or_held_many}};

-- name: tick_schedule
-- Advance schedule %(schedule)s from the tick it awaited, %(awaited)s, to %(next_run_at)s, and
-- enqueue its todo %(id)s for %(tick)s, unless %(enqueue)s is false (a missed tick skipped).
-- The compare-and-set on next_run_at, in the statement that inserts, lets one scheduler of any
-- number take each tick; the todo's idempotency key names the schedule and the tick.
WITH advanced AS (
    UPDATE todo_schedules
       SET next_run_at = %(next_run_at)s,
           last_tick_at = %(tick)s,
           last_todo_id = CASE WHEN %(enqueue)s THEN %(id)s ELSE last_todo_id END,
           updated_at = now()
     WHERE name = %(schedule)s AND next_run_at = %(awaited)s AND NOT paused
     RETURNING *
),
inserted AS (
    INSERT INTO todos (id, queue, source, kind, title, payload, idempotency_key, max_attempts,
                       priority, concurrency_key)
    SELECT %(id)s, queue, 'schedule', kind, title, payload, %(idempotency_key)s, max_attempts,
           priority, concurrency_key
      FROM advanced
     WHERE %(enqueue)s
    {{unless_key_held}}
    RETURNING *
),
{{notified(inserted WHERE %(notify)s)}}
SELECT * FROM inserted WHERE (SELECT count(*) FROM notified) >= 0;

-- name: claim_next
-- Claim up to %(limit)s of the claimable todos in %(queues)s for %(owner)s: the highest
-- priority first, then the longest-claimable. Each queue is its own index scan (in priority,
-- then created_at order) that stops at the first unlocked rows, so the cost does not grow with
-- the backlog; a plain "queue = ANY(...) ORDER BY" would sort the whole backlog. Retries that
-- fell due and lapsed leases come from their own scans, in the order they became claimable,
-- up to %(limit)s each; all candidates are then ranked by priority and claimable time. A todo
-- whose concurrency key another claimed todo holds is passed over, and of candidates sharing a
-- key only the first is taken, so one key is never claimed twice. The scan of a queue's ready
-- todos starts at low-water marks (marks.py): each priority this process has claimed from,
-- %(group_priorities)s of %(group_queues)s, from its own mark, %(group_marks)s; the priorities
-- above %(tops)s and below %(bottoms)s from the queue's mark, %(marks)s (year 1: from the head
-- of the index); in priority order, and only as far as the limit needs. Lapsed leases are
-- looked for only when %(full_scan)s. A paused queue is not scanned at all, and a limited
-- one only as far as its room (the "room" CTE: the pause, rate and concurrency limits of the
-- queues' todo_queues rows, read and enforced in this statement).
-- Written for a prepared claim to keep one generic plan (cursors.py), not to be planned anew
-- at each call, which costs more than running it. So the planner must not see the queues,
-- the marks, the owner, the limit or whether it is a full scan, all read through
-- "(SELECT ...)": every call then gets the same plan, and the generic one wins. Each scan
-- locks rows under a constant "LIMIT 1000" (the largest claim_batch
-- limit) and yields them to the real limit above it, which stops pulling, hence locking, at
-- %(limit)s rows: the constant keeps the plan's estimated cost small however large the
-- backlog, which keeps PostgreSQL from JIT-compiling the plan at every call. And
-- "= ANY (ARRAY(...))" keeps the update on the primary key whatever the planner expects.
WITH {{room((SELECT %(queues)s::text[])::text[])}},
ready AS MATERIALIZED (
    SELECT candidate.id, wanted.queue, candidate.priority, candidate.concurrency_key,
           candidate.created_at AS claimable_at
      FROM unnest((SELECT %(queues)s::text[]), (SELECT %(marks)s::timestamptz[]),
                  (SELECT %(tops)s::int[]), (SELECT %(bottoms)s::int[]))
           AS wanted (queue, mark, top, bottom)
      LEFT JOIN room ON room.queue = wanted.queue
     CROSS JOIN LATERAL (
            SELECT * FROM (
                {{ready_scan(wanted.queue, priority > wanted.top, wanted.mark)}}
                UNION ALL
                SELECT known.*
                  FROM unnest((SELECT %(group_queues)s::text[]),
                              (SELECT %(group_priorities)s::int[]),
                              (SELECT %(group_marks)s::timestamptz[]))
                       AS grp (queue, priority, mark)
                 CROSS JOIN LATERAL (
                        {{ready_scan(grp.queue, priority = grp.priority, grp.mark)}}
                       ) AS known
                 WHERE grp.queue = wanted.queue
                UNION ALL
                {{ready_scan(wanted.queue, priority < wanted.bottom, wanted.mark)}}
            ) AS locked
            LIMIT least((SELECT %(limit)s::int), room.room)
           ) AS candidate
),
due AS MATERIALIZED (
    SELECT candidate.id, wanted.queue, candidate.priority, candidate.concurrency_key,
           candidate.next_retry_at AS claimable_at
      FROM unnest((SELECT %(queues)s::text[])) AS wanted (queue)
      LEFT JOIN room ON room.queue = wanted.queue
     CROSS JOIN LATERAL (
            SELECT * FROM (
                SELECT id, priority, concurrency_key, next_retry_at
                  FROM todos
                 WHERE state = 'pending' AND next_retry_at IS NOT NULL
                   AND queue = wanted.queue
                   AND next_retry_at <= now()
                   AND (assignee IS NULL OR assignee = (SELECT %(owner)s::text))
                   AND {{key_free(todos)}}
                 ORDER BY next_retry_at
                 LIMIT 1000
                   FOR UPDATE SKIP LOCKED
            ) AS locked
            LIMIT least((SELECT %(limit)s::int), room.room)
           ) AS candidate
),
lapsed AS MATERIALIZED (
    SELECT * FROM (
        SELECT id, queue, priority, concurrency_key, lease_expires_at AS claimable_at
          FROM todos
         WHERE (SELECT %(full_scan)s::bool) AND state = 'claimed'
           AND lease_expires_at <= now()
           AND attempt < max_attempts
           AND queue = ANY ((SELECT %(queues)s::text[])::text[])
           AND (assignee IS NULL OR assignee = (SELECT %(owner)s::text))
         ORDER BY lease_expires_at
         LIMIT 1000
           FOR UPDATE SKIP LOCKED
    ) AS locked
    LIMIT (SELECT %(limit)s::int)
),
{{picked}},
{{slot((SELECT %(limit)s::int))}},
claimed AS (
    UPDATE todos
       {{set_claimed}}
     WHERE id = ANY (ARRAY(SELECT id FROM picked))
    RETURNING todos.*
),
{{counted}}
SELECT claimed.*, picked.claimable_at
  FROM claimed JOIN picked ON picked.id = claimed.id
 ORDER BY picked.priority DESC, picked.claimable_at;

-- name: claim_filtered
-- Claim the todos an ORM queryset picks (querysets.py). The three placeholders in braces are
-- its scans of ready todos, due retries and lapsed leases, each a SELECT of id, queue,
-- priority, concurrency_key and claimable_at, FOR UPDATE SKIP LOCKED, in claim order, carrying the
-- claimable, assignee and concurrency-key conditions; the update tests the first two again, so
-- that no queryset can make it claim what is not claimable. All candidates are then ranked by
-- priority and claimable time; of those sharing a key only the first is taken, and
-- idx_todos_key_claimed settles a race with another claim (managers.py).
WITH ready AS MATERIALIZED (
    {ready}
),
due AS MATERIALIZED (
    {due}
),
lapsed AS MATERIALIZED (
    {lapsed}
),
{{room(ARRAY(SELECT queue FROM ready UNION SELECT queue FROM due UNION SELECT queue FROM lapsed))}},
{{picked}},
{{slot((SELECT %(limit)s::int))}},
claimed AS (
    UPDATE todos
       {{set_claimed}}
     WHERE id = ANY (ARRAY(SELECT id FROM picked))
       AND (state = 'pending' AND (next_retry_at IS NULL OR next_retry_at <= now())
            OR state = 'claimed' AND lease_expires_at <= now() AND attempt < max_attempts)
       AND (assignee IS NULL OR assignee = %(owner)s)
    RETURNING todos.*
),
{{counted}}
SELECT * FROM claimed;

-- name: claim
-- Claim one todo by id: pending and due, or claimed with a lapsed lease and attempts left, in
-- a queue that is neither paused nor at a limit (the "room" CTE).
WITH {{room(ARRAY(SELECT queue FROM todos WHERE id = %(todo_id)s))}},
picked AS (
    SELECT id, queue, 1 AS in_queue
      FROM todos
     WHERE id = %(todo_id)s
       AND coalesce((SELECT room.room FROM room WHERE room.queue = todos.queue), 1) > 0
),
{{slot(1)}},
claimed AS (
    UPDATE todos
       {{set_claimed}}
     WHERE id = (SELECT id FROM picked)
       AND (assignee IS NULL OR assignee = %(owner)s)
       AND (state = 'pending' AND (next_retry_at IS NULL OR next_retry_at <= now())
            OR state = 'claimed' AND lease_expires_at <= now() AND attempt < max_attempts)
       AND {{key_free(todos)}}
    RETURNING todos.*
),
{{counted}}
SELECT * FROM claimed;

-- name: await_todo
-- Mark todo %(todo_id)s awaited while it is pending or claimed, so that the statement ending it
-- notifies its end (finished); no row when it has ended already, or does not exist. Its row lock
-- orders it with that statement: marked first, the end sees the mark; ended first, no row.
UPDATE todos
   SET awaited = true
 WHERE id = %(todo_id)s AND state IN ('pending', 'claimed')
RETURNING id;

-- name: heartbeat
-- Extend the lease of a todo the owner still holds (lease_end), and keep %(progress)s as its
-- latest progress note (none given: the last one stays). Guard: claimed, same owner.
UPDATE todos
   SET lease_expires_at = {{lease_end(todos)}},
       progress = coalesce(%(progress)s::jsonb, progress),
       updated_at = now()
 WHERE id = %(todo_id)s AND state = 'claimed' AND owner = %(owner)s
RETURNING *;

-- name: heartbeat_many
-- Extend the leases of many todos the owner holds, in one statement that never waits on a row
-- lock: a todo another session has locked (an operator's statement, a long transaction) is
-- skipped, and the caller tries it again at its next beat, well before the lease lapses.
-- %(progress)s (a JSON object, or null) maps some of the ids to their latest progress notes.
-- Returns each id the owner held when the statement began, and whether its lease was extended;
-- and each one an operator cancelled while the owner held it (cancelled_hold), so that its
-- holder stops.
WITH extended AS (
UPDATE todos
   SET lease_expires_at = {{lease_end(todos)}},
       progress = coalesce(%(progress)s::jsonb -> todos.id, todos.progress),
       updated_at = now()
 WHERE id = ANY (ARRAY(
           SELECT id FROM todos
            WHERE id = ANY (%(todo_ids)s::text[]) AND state = 'claimed' AND owner = %(owner)s
              FOR UPDATE SKIP LOCKED))
   AND state = 'claimed' AND owner = %(owner)s
RETURNING id
)
SELECT todos.id, todos.id IN (SELECT id FROM extended) AS extended,
       todos.state <> 'claimed' AS cancelled
  FROM todos
 WHERE todos.id = ANY (%(todo_ids)s::text[]) AND todos.owner = %(owner)s
   AND (todos.state = 'claimed' OR {{cancelled_hold(todos)}});

-- name: complete
-- Mark a todo done with its result, and unblock the todos waiting for it (their last parent
-- done, they are claimable now, in the same statement). Guard: claimed, same owner.
WITH completed AS (
UPDATE todos
   SET state = 'done', result = %(result)s::jsonb, lease_expires_at = NULL,
       completed_at = now(), updated_at = now()
 WHERE id = %(todo_id)s AND state = 'claimed' AND owner = %(owner)s
   AND {{children_seen(todos)}}
RETURNING *
),
{{unblocked((SELECT unnest(children) AS child_id FROM completed) AS edge)}},
{{notified_per_queue(unblocked WHERE state = 'pending' AND waiting_for <= 0 AND %(notify)s)}},
{{finished(completed WHERE awaited)}}
SELECT * FROM completed
 WHERE (SELECT count(*) FROM notified) >= 0 AND (SELECT count(*) FROM finished) >= 0;

-- name: complete_many
-- Mark many todos done, each with its own result, and unblock the todos waiting for them;
-- returns the ids completed, and (done false) those still held that were left alone because a
-- child of theirs appeared meanwhile (children_seen: the manager runs them again), read only
-- when something was left alone. %(results)s is one JSON object, id to result (null: none):
-- sent as one value, not as two arrays whose every element the client escapes one by one.
-- It never waits for a row lock: a todo another session holds locked is left alone too (the
-- manager runs it again). A claim locks rows that were pending when it began and have been
-- claimed since (PostgreSQL keeps the lock of a row whose recheck failed), and a claim into a
-- concurrency key or a limited queue's slot waits for the statements finishing the todos
-- that held them: waiting here closed that circle, a deadlock that PostgreSQL breaks only
-- after deadlock_timeout, a second lost by both.
-- The rows are locked and tested in "mine" (the newest version of each), so the update finds
-- them by primary key alone: given the owner too, a planner that expected one held todo
-- looked them up by owner once per todo.
WITH mine AS MATERIALIZED (
    SELECT todos.id, batch.result
      FROM jsonb_each(%(results)s::jsonb) AS batch (id, result)
      JOIN todos ON todos.id = batch.id
     WHERE todos.state = 'claimed' AND todos.owner = %(owner)s
       FOR NO KEY UPDATE OF todos SKIP LOCKED
),
completed AS (
UPDATE todos
   SET state = 'done', result = nullif(mine.result, 'null'), lease_expires_at = NULL,
       completed_at = now(), updated_at = now()
  FROM mine
 WHERE todos.id = mine.id AND {{children_seen(todos)}}
RETURNING todos.id, todos.children, todos.awaited
),
{{unblocked((SELECT unnest(children) AS child_id FROM completed) AS edge)}},
{{notified_per_queue(unblocked WHERE state = 'pending' AND waiting_for <= 0 AND %(notify)s)}},
{{finished(completed WHERE awaited)}}
SELECT id, true AS done FROM completed
 WHERE (SELECT count(*) FROM notified) >= 0 AND (SELECT count(*) FROM finished) >= 0
UNION ALL
SELECT id, false AS done
  FROM todos
 WHERE (SELECT count(*) FROM completed) < (SELECT count(*) FROM jsonb_each(%(results)s::jsonb))
   AND id IN (SELECT jsonb_object_keys(%(results)s::jsonb))
   AND state = 'claimed' AND owner = %(owner)s
   AND id NOT IN (SELECT id FROM completed);

-- name: fail
-- Record a failed attempt: back to pending after a backoff below the cap, dead letter at it,
-- settling the todos that wait for it (settled). %(delays)s is the backoff schedule, one entry
-- per attempt; the last entry repeats.
WITH failed AS (
UPDATE todos
   SET state = CASE WHEN attempt >= max_attempts THEN 'failed' ELSE 'pending' END,
       next_retry_at = CASE WHEN attempt < max_attempts THEN now() + coalesce(
                           %(retry_in)s::interval,
                           make_interval(secs => (%(delays)s::float8[])[
                               least(attempt, cardinality(%(delays)s::float8[]))]))
                       END,
       owner = NULL,
       lease_expires_at = NULL,
       result = %(error)s::jsonb,
       errors = {{errors_with(owner, %(error)s::jsonb)}},
       errors_dropped = {{errors_dropped_with}},
       completed_at = CASE WHEN attempt >= max_attempts THEN now() END,
       updated_at = now()
 WHERE id = %(todo_id)s AND state = 'claimed' AND owner = %(owner)s
   AND {{children_seen(todos)}}
RETURNING *
),
{{settled(failed WHERE state = 'failed')}},
{{notified((SELECT queue FROM failed WHERE state = 'pending' AND next_retry_at <= now() UNION SELECT queue FROM unblocked WHERE state = 'pending' AND waiting_for <= 0) AS woken WHERE %(notify)s)}},
{{finished((SELECT id, awaited FROM failed WHERE state = 'failed' UNION ALL SELECT id, awaited FROM cancelled_below) AS ended WHERE awaited)}}
SELECT * FROM failed
 WHERE (SELECT count(*) FROM notified) >= 0 AND (SELECT count(*) FROM finished) >= 0;

-- name: release
-- Give the lease back without using up an attempt; claimable again after %(delay)s (zero: at
-- once), as a due todo: behind work already waiting, found by the scan of due todos whatever
-- the claim's low-water marks.
WITH released AS (
UPDATE todos
   SET state = 'pending',
       owner = NULL,
       lease_expires_at = NULL,
       attempt = greatest(attempt - 1, 0),
       next_retry_at = now() + %(delay)s::interval,
       updated_at = now()
 WHERE id = %(todo_id)s AND state = 'claimed' AND owner = %(owner)s
RETURNING *
),
{{notified(released WHERE next_retry_at <= now() AND %(notify)s)}}
SELECT * FROM released WHERE (SELECT count(*) FROM notified) >= 0;

-- name: reap_expired
-- Return up to %(limit)s lapsed leases to pending, the longest lapsed first, or dead-letter them
-- when their attempts are used up (settling the todos that wait for them): one bounded batch,
-- which the reaper repeats while batches come back full. Rows another session is transitioning right now are skipped, so reapers
-- never block or race.
WITH lapsed AS (
    SELECT id
      FROM todos
     WHERE state = 'claimed' AND lease_expires_at <= now() AND {{children_seen(todos)}}
     ORDER BY lease_expires_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
reaped AS (
    UPDATE todos
       SET state = CASE WHEN attempt >= max_attempts THEN 'failed' ELSE 'pending' END,
           owner = NULL,
           lease_expires_at = NULL,
           result = CASE WHEN attempt >= max_attempts THEN jsonb_build_object('type', 'LeaseExpired',
                        'message', 'The lease lapsed on the last attempt.') ELSE result END,
           errors = {{errors_with(owner, {{lease_expired}})}},
           errors_dropped = {{errors_dropped_with}},
           completed_at = CASE WHEN attempt >= max_attempts THEN now() END,
           updated_at = now()
      FROM lapsed
     WHERE todos.id = lapsed.id
    RETURNING todos.id, todos.state, todos.queue, todos.children, todos.awaited
),
{{settled(reaped WHERE state = 'failed')}},
{{finished((SELECT id, awaited FROM reaped WHERE state = 'failed' UNION ALL SELECT id, awaited FROM cancelled_below) AS ended WHERE awaited)}},
{{notified_per_queue((SELECT queue, state FROM reaped UNION ALL SELECT queue, state FROM unblocked WHERE waiting_for <= 0) AS woken WHERE state = 'pending' AND %(notify)s)}}
SELECT count(*) FILTER (WHERE state = 'pending') AS requeued,
       count(*) FILTER (WHERE state = 'failed') AS dead_lettered,
       coalesce(array_agg(id), '{}') AS ids
  FROM reaped
 WHERE (SELECT count(*) FROM notified) >= 0 AND (SELECT count(*) FROM finished) >= 0;

-- name: requeue
-- Operator redrive: dead letters in %(ids)s back to pending with a fresh attempt budget, and
-- with them the todos that were cancelled because they failed (revived). Each that waits for
-- others waits again for those not done (waiting_again): blocked until then. Guard: failed,
-- and no live todo holds its idempotency key (else idx_todos_dedupe would fail); of several
-- dead letters in %(ids)s sharing a key, only the newest goes back.
WITH wanted AS (
    SELECT DISTINCT ON (queue, coalesce(idempotency_key, id)) id
      FROM todos
     WHERE id = ANY (%(ids)s::text[]) AND state = 'failed'
     ORDER BY queue, coalesce(idempotency_key, id), created_at DESC, id
),
{{parents_shared(wanted_parent, wanted)}},
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
{{revived(requeued)}},
{{notified((SELECT queue FROM requeued WHERE next_retry_at IS NULL UNION SELECT queue FROM revived WHERE next_retry_at <= now()) AS woken WHERE %(notify)s)}}
SELECT * FROM requeued WHERE (SELECT count(*) FROM notified) >= 0;

-- name: expire_lease
-- Operator: make the leases of the claimed todos in %(ids)s lapse now, so the reaper or the next
-- claim takes them back. Guard: claimed. A lease that already lapsed keeps its time.
WITH expired AS (
UPDATE todos
   SET lease_expires_at = least(lease_expires_at, now()), updated_at = now()
 WHERE id = ANY (%(ids)s::text[]) AND state = 'claimed'
RETURNING *
),
{{notified(expired WHERE %(notify)s)}}
SELECT * FROM expired WHERE (SELECT count(*) FROM notified) >= 0;

-- name: cancel
-- Operator cancel: the pending or claimed todos in %(ids)s become dead letters, %(reason)s
-- recorded as the result and in the failure history (with the attempt it ended, for a claimed
-- one), and the todos that wait for them are settled (settled). A claimed todo's lease ends,
-- and it keeps its owner (cancelled_hold): the holder's next heartbeat, complete, fail or
-- release is told it was cancelled. Guard: pending or claimed.
WITH dead AS (
UPDATE todos
   SET state = 'failed',
       next_retry_at = NULL,
       lease_expires_at = NULL,
       result = {{cancelled}},
       errors = {{errors_with(owner, {{cancelled}})}},
       errors_dropped = {{errors_dropped_with}},
       completed_at = now(),
       updated_at = now()
 WHERE id = ANY (%(ids)s::text[]) AND state IN ('pending', 'claimed')
   AND {{children_seen(todos)}}
RETURNING *
),
{{settled(dead)}},
{{notified_per_queue(unblocked WHERE state = 'pending' AND waiting_for <= 0 AND %(notify)s)}},
{{finished((SELECT id, awaited FROM dead UNION ALL SELECT id, awaited FROM cancelled_below) AS ended WHERE awaited)}}
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

-- name: purge_batch
-- Delete up to %(limit)s finished todos (%(states)s, only done or failed) completed more than
-- %(older_than)s ago and at or after %(after)s, oldest first; one short transaction per batch.
-- Rows another session holds are skipped, never waited for. Walking idx_todos_finished from
-- %(after)s (the newest completed_at of the previous batch) keeps every batch as cheap as the
-- first: the index entries of rows deleted by earlier batches are never walked again.
WITH doomed AS (
    SELECT id
      FROM todos
     WHERE state IN ('done', 'failed')
       AND state = ANY (%(states)s::text[])
       AND completed_at < now() - %(older_than)s::interval
       AND completed_at >= coalesce(%(after)s::timestamptz, '-infinity')
       AND (%(queues)s::text[] IS NULL OR queue = ANY (%(queues)s::text[]))
     ORDER BY completed_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
{{purged}};

-- name: purge_retained
-- Delete up to %(limit)s done and failed todos of queue %(queue)s completed longer ago than its
-- retention, %(retention)s, and at or after %(after)s, oldest first; one bounded batch, which
-- the reaper repeats while batches come back full. Nothing when the queue's retention
-- (todo_queues) has since been cleared or made longer. Like purge_batch it walks
-- idx_todos_finished from %(after)s, the newest completed_at a previous batch deleted: a todo
-- is only ever completed at now(), so no deletable todo appears behind that mark, and the
-- reaper keeps it from sweep to sweep instead of walking again, every few seconds, past the
-- finished todos of queues kept for ever. Rows another session holds are skipped.
WITH doomed AS (
    SELECT id
      FROM todos
     WHERE state IN ('done', 'failed')
       AND completed_at < now() - %(retention)s::interval
       AND completed_at >= coalesce(%(after)s::timestamptz, '-infinity')
       AND queue = %(queue)s
       AND %(retention)s::interval <= (SELECT retention FROM todo_queues WHERE name = %(queue)s)
     ORDER BY completed_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
{{purged}};

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

-- name: notify_queues
-- Wake the workers of %(queues)s, on commit: enqueue_many's COPY cannot notify by itself.
SELECT pg_notify('switchboard_todos', queue) FROM unnest(%(queues)s::text[]) AS woken (queue);

-- name: queue_max_attempts
-- The default max_attempts of those of %(queues)s that have one (todo_queues): enqueue_many
-- reads them before its COPY, which cannot look them up row by row.
SELECT name, max_attempts
  FROM todo_queues
 WHERE name = ANY (%(queues)s::text[]) AND max_attempts IS NOT NULL;
