-- The todo state machine in SQL, one guarded statement per transition, in one file per family:
-- creating.sql, claiming.sql, holding.sql, operating.sql and retention.sql. This file holds
-- what they all follow, and the fragments that statements of two or more families share.
--
-- Format: a block starts at "-- name: <operation>" (the TodoManager method of the same name)
-- and runs to the next such line; its first comment line is the contract. Parameters are
-- named, %(name)s. Time is always the database's now(): the application's clock never
-- decides a lease. A statement that returns no row missed its guard, and the manager
-- classifies the miss (TodoNotFound or TodoConflict). Each statement that writes todos has its
-- row in transitions.py, whose from-states are the states its guard tests (a test holds them).
-- Twins that differ only in a constant are one block, "-- name: x(cap=1000), x_few(cap=100)",
-- where $cap in the text stands for each one's value (claim_next, claim_next_few).
--
-- When a todo becomes claimable: a pending todo with no next_retry_at at created_at, one with
-- a next_retry_at at that time, and a claimed todo whose lease expired at lease_expires_at.
-- Claims take the highest priority first and, within a priority, the earliest turn first
-- (fair_at: a todo's creation time without a fair key; with one, its key's turn, fair_turn),
-- a due retry or an expired lease at its turn or when it became claimable, whichever is later:
-- so a retried todo queues behind work that was already waiting, as a message that becomes
-- visible again does in SQS, and the fair keys of a queue take turns.
--
-- A statement that makes todos claimable right now also sends NOTIFY switchboard_todos with the
-- queue name as payload, once per queue and statement (never per row), so that listening
-- workers wake at once; %(notify)s (SWITCHBOARD_TODOS_LISTEN) turns that off. NOTIFY is
-- transactional: it is delivered when the caller's transaction commits, and not at all if it
-- rolls back. The "notified" CTE runs only because the final query references it, hence the
-- always-true "WHERE (SELECT count(*) FROM notified) >= 0". Likewise, a statement that ends
-- todos tells whoever waits for one of them (wait_for) in its "finished" CTE: NOTIFY
-- switchboard_todos_done with the todo's id, only for a todo someone marked awaited, so that
-- the others cost nothing but the test.
--
-- What several statements share is written once, as a fragment: "-- fragment: x(a, b)" defines
-- it, "{{x(value, value)}}" places it, $a in its body stands for the value given (sql/__init__.py
-- composes them when the files are loaded; a fragment of any file serves every file). A
-- fragment is an expression, a clause or the body of a CTE, never the CTE itself: every CTE a
-- statement uses is named in the statement's own text, and a fragment reads a CTE only through
-- a parameter, so the statement shows what flows where. A fragment of one family sits in its
-- file, above the statements that use it; what one statement uses once is written out in it.

-- fragment: live(state)
-- A todo that holds its idempotency key: pending or claimed, neither done nor failed. This is
-- the predicate of idx_todos_dedupe; `state` is the column, qualified as the statement needs.
$state <> 'done' AND $state <> 'failed'

-- fragment: blocked
-- The next_retry_at of a todo that waits for others: later than any claim will look, and
-- still a date Python can read (year 9999, not 'infinity').
'9999-01-01 00:00:00+00'::timestamptz

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

-- fragment: fair_turn(queue, priority, fair_key)
-- The turn (fair_at) of a todo of `fair_key` (not NULL) at `queue` and `priority`: start-time
-- fair queuing (docs/queues.md, fairness). The queue's head at that priority (the turn of its
-- first ready todo), or one step (FAIR_STEP, 1 ms) after the key's last pending todo there,
-- whichever is later; now() for the first todo of an idle queue. So a key that was idle
-- starts level with the head of the key that has a backlog, and each key's todos follow one
-- step apart: within a priority, the keys take turns. Two index probes of one entry each, the
-- head of idx_todos_pending and the tail of idx_todos_lane; todos without a key take their
-- creation time instead, and pay neither.
coalesce(greatest(
    (SELECT head.fair_at FROM todos AS head
      WHERE head.state = 'pending' AND head.next_retry_at IS NULL
        AND head.queue = $queue AND head.priority = $priority
      ORDER BY head.fair_at
      LIMIT 1),
    (SELECT lane.fair_at + interval '1 millisecond' FROM todos AS lane
      WHERE lane.state = 'pending' AND lane.fair_key = $fair_key
        AND lane.queue = $queue AND lane.priority = $priority
      ORDER BY lane.fair_at DESC
      LIMIT 1)),
    now())

-- fragment: credential_holds
-- The caller's credential still holds, if it names one: the agent %(owner)s is active under
-- the salt %(credential)s, which every rotation and revocation of its credentials replaces
-- (agents/accounts.py). The remote surfaces name the one they read, maybe seconds ago
-- (agents/service/identity.py), so that a revoked agent's very next statement acts on nothing
-- without a statement of its own to check it. In-process callers name none (null).
(%(credential)s::text IS NULL OR EXISTS (
     SELECT FROM todo_agents AS agent
      WHERE agent.name = (SELECT %(owner)s::text) AND agent.is_active
        AND agent.credential_salt = %(credential)s))

-- fragment: under_receipt(todo)
-- `todo` is held under the receipt the caller names, if it names one: the attempt
-- %(receipt_attempt)s and the moment of the claim %(receipt_claimed_at)s (an SQS receipt
-- handle's, sqs/messages.py), so that the handle of an earlier receipt of the same message acts
-- on nothing. Without a receipt (null), any claim of the owner's will do.
(%(receipt_attempt)s::int IS NULL
 OR $todo.attempt = %(receipt_attempt)s AND $todo.claimed_at = %(receipt_claimed_at)s)

-- fragment: cancelled_hold(todo)
-- `todo` was cancelled by an operator while its owner held it: a dead letter whose result is
-- the cancel's error and which, alone of the dead letters, keeps its owner (fail, the reaper
-- and requeue clear it), so that the holder can be told "cancelled" rather than "not yours".
($todo.state = 'failed' AND $todo.owner IS NOT NULL AND $todo.result ->> 'type' = 'Cancelled')

-- fragment: error_entries(todos, owner, error)
-- The body of the "entry" CTE of a statement that appends to the failure history (todo_errors,
-- a row an entry): for each row of `todos` (a FROM item of todos as the statement locked them,
-- before it changes them) the entry of the attempt that ended: who held it (`owner`), when it
-- was claimed and when it ended, and `error`, an object with "type" and "message" (trimmed to
-- SWITCHBOARD_TODOS_MAX_ERROR_BYTES before the statement); with its size, bytes of JSON. Its
-- "trimmed" CTE (trimmed) makes room for it, its "noted" CTE (noted) inserts it, and the
-- statement adds what trimmed deleted to the todo's errors_dropped (dropped), and what the
-- history grew by to its errors_bytes (grown).
SELECT todo_id, attempt, entry, octet_length(entry::text) AS size
  FROM (SELECT id AS todo_id, attempt,
               jsonb_build_object('attempt', attempt, 'owner', $owner, 'claimed_at', claimed_at,
                                  'at', now(), 'error', $error) AS entry
          FROM $todos) AS made

-- fragment: trimmed(entry)
-- The body of the "trimmed" CTE: the oldest entries of each todo of `entry` deleted, so that
-- with its new one it keeps at most %(max_errors_kept)s entries and
-- %(max_error_history_bytes)s bytes (the new entry, whatever its size). Decided on the sizes
-- alone: the JSON of the history is neither read nor written again, and a fail writes the WAL
-- of its own entry. The entries of a todo are written under its row's lock, so ids grow with
-- their age. The entries are those of the statement's snapshot: one another statement added
-- while this one waited for the row is not seen, and waits for the next entry to be trimmed
-- (errors_dropped and errors_bytes, counted on the row as it is now, stay right). The
-- doomed ids are an array, probed through the primary key (as a purge's, purged).
DELETE FROM todo_errors
 WHERE id = ANY (ARRAY(
        SELECT older.id
          FROM $entry AS new
         CROSS JOIN LATERAL (
                SELECT id, row_number() OVER newest AS newer, sum(size) OVER newest AS bytes
                  FROM todo_errors
                 WHERE todo_errors.todo_id = new.todo_id
                WINDOW newest AS (ORDER BY id DESC)
               ) AS older
         WHERE older.newer >= %(max_errors_kept)s::int
            OR older.bytes + new.size > %(max_error_history_bytes)s::bigint))
RETURNING todo_id, size

-- fragment: noted(entry)
-- The body of the "noted" CTE: the entries of `entry` inserted.
INSERT INTO todo_errors (todo_id, attempt, entry, size)
SELECT todo_id, attempt, entry, size FROM $entry

-- fragment: dropped(trimmed, todo)
-- How many entries of `todo`'s history `trimmed` (the "trimmed" CTE) deleted, for its
-- errors_dropped: counted once into a JSON object, id to count, that each row looks itself up
-- in (as set_claimed's slots), not by a scan of `trimmed` per row.
coalesce(((SELECT jsonb_object_agg(todo_id, count)
             FROM (SELECT todo_id, count(*) AS count FROM $trimmed GROUP BY todo_id) AS gone)
          ->> $todo.id)::int, 0)

-- fragment: grown(entry, trimmed, todo)
-- How many bytes `todo`'s history grew by, for its errors_bytes (the sum of its entries'
-- sizes, 0 for none): its new entry's (of `entry`), less those `trimmed` deleted; each
-- gathered once into a JSON object, as dropped's.
coalesce(((SELECT jsonb_object_agg(todo_id, size) FROM $entry) ->> $todo.id)::bigint, 0)
- coalesce(((SELECT jsonb_object_agg(todo_id, size)
               FROM (SELECT todo_id, sum(size) AS size FROM $trimmed GROUP BY todo_id) AS gone)
            ->> $todo.id)::bigint, 0)

-- fragment: lease_expired
-- The error of an attempt whose lease expired: recorded by the reaper, or the claim taking over.
jsonb_build_object('type', 'LeaseExpired',
    'message', 'The lease lapsed before complete, fail or release.')

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

-- fragment: locked_in_order(ids)
-- The body of a CTE that locks the todos `ids` (a SELECT of ids) in id order before a later
-- CTE changes them: two statements finishing parents of the same children take turns, and
-- never deadlock. What the failure history's entry of each needs (error_entries) is read as
-- the row is now.
SELECT id, state, attempt, claimed_at
  FROM todos
 WHERE id = ANY (ARRAY($ids))
 ORDER BY id
   FOR NO KEY UPDATE

-- fragment: unblocked(edges, waiting)
-- The body of the "unblocked" CTE: each todo named by a `child_id` of `edges` (a FROM item,
-- one row per parent of it that just finished: done, or a dead letter it runs anyway after;
-- todo_edges, or spared) counts that many parents fewer, and one left with none becomes due now, claimable as a new
-- todo is. The children were locked in id order first, in the CTE `waiting`
-- (locked_in_order); of 8 parents of one child finishing at once, each decrement sees the one
-- before. Their state is tested on the rows as they are now (in SET, not in the scans), so
-- that a child a concurrent requeue has just brought back is counted.
UPDATE todos AS child
   SET waiting_for = CASE WHEN child.state = 'pending' AND child.waiting_for > 0
                          THEN child.waiting_for - edge.count ELSE child.waiting_for END,
       next_retry_at = CASE WHEN child.state = 'pending' AND child.waiting_for > 0
                             AND child.waiting_for - edge.count <= 0 THEN now()
                            ELSE child.next_retry_at END,
       updated_at = now()
  FROM (SELECT child_id, count(*) AS count FROM $edges GROUP BY child_id) AS edge
 WHERE child.id = edge.child_id AND child.id IN (SELECT id FROM $waiting)
RETURNING child.id, child.queue, child.state, child.waiting_for, child.next_retry_at

-- fragment: oldest_batch(column)
-- The end of a sweep's scan (the reaper, a purge): the %(limit)s rows oldest by `column`, each
-- locked as it is read, skipping those another session holds: a batch never waits for a row,
-- and two sweeps never take the same one.
ORDER BY $column
LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED

-- fragment: notify_unblocked(unblocked)
-- The body of the "notified" CTE of a statement whose only newly claimable todos are those it
-- unblocked (`unblocked`, the CTE of that name): one notification per queue.
SELECT pg_notify('switchboard_todos', queue)
  FROM (SELECT DISTINCT queue
          FROM $unblocked WHERE state = 'pending' AND waiting_for <= 0 AND %(notify)s)
       AS claimable

-- fragment: notify_ended(ended)
-- The body of the "finished" CTE: NOTIFY switchboard_todos_done with the id of each todo of
-- `ended` (a FROM item of the todos that just ended and are awaited).
SELECT pg_notify('switchboard_todos_done', id)
  FROM $ended

-- fragment: lost(fallen)
-- The body of the "lost" CTE: the todos to be cancelled because one of `fallen` (a FROM item
-- of rows with an id, just made dead letters) failed, each with the parent it fails for: those
-- waiting for one with on_parent_failure 'cancel', and in turn those waiting for them, found
-- through todo_edges. Settling what waits for dead letters takes nine CTEs, which fail,
-- reap_expired and cancel write in this order: "lost", "spared" (those that run anyway),
-- "held_below" (all of them locked in id order: locked_in_order), "entry_below",
-- "trimmed_below" and "noted_below" (the entry of each in its failure history: lost_held),
-- "cancelled_below" (the lost made dead letters saying which parent failed), then "waiting"
-- and "unblocked" (the spared count the failed parent as finished).
WITH RECURSIVE below (id, parent) AS (
    SELECT child.id, gone.id
      FROM (SELECT id FROM $fallen) AS gone
      JOIN todo_edges AS edge ON edge.parent_id = gone.id
      JOIN todos AS child ON child.id = edge.child_id
     WHERE child.state = 'pending' AND child.on_parent_failure = 'cancel'
    UNION
    SELECT child.id, below.id
      FROM below
      JOIN todo_edges AS edge ON edge.parent_id = below.id
      JOIN todos AS child ON child.id = edge.child_id
     WHERE child.state = 'pending' AND child.on_parent_failure = 'cancel'
)
SELECT DISTINCT ON (id) id, parent FROM below ORDER BY id, parent

-- fragment: spared(fallen, lost)
-- The body of the "spared" CTE: the children of `fallen` and of `lost` (the todos cancelled
-- with them) that run anyway after a failed parent (on_parent_failure 'run_anyway'), one row
-- per such parent: the edges that "unblocked" counts.
SELECT child.id AS child_id
  FROM (SELECT id FROM $fallen UNION ALL SELECT id FROM $lost) AS gone
  JOIN todo_edges AS edge ON edge.parent_id = gone.id
  JOIN todos AS child ON child.id = edge.child_id
 WHERE child.on_parent_failure = 'run_anyway'

-- fragment: lost_held(lost, held_below)
-- The FROM item of the todos of `lost` that "cancelled_below" ends: those locked in
-- `held_below` and pending still, with the parent each fails for; the history's entries of
-- the statement's "entry_below" CTE are theirs.
$held_below JOIN $lost USING (id) WHERE $held_below.state = 'pending'

-- fragment: cancelled_below(lost, held_below, entry, trimmed)
-- The body of the "cancelled_below" CTE: the todos of `lost` made dead letters, each saying
-- which parent failed; those locked in `held_below` and pending still (lost_held), their
-- histories' new entries (`entry`) and the entries `trimmed` deleted counted.
UPDATE todos
   SET state = 'failed', next_retry_at = NULL, completed_at = now(), updated_at = now(),
       result = {{parent_failed($lost.parent)}},
       errors_dropped = errors_dropped + {{dropped($trimmed, todos)}},
       errors_bytes = errors_bytes + {{grown($entry, $trimmed, todos)}}
  FROM $lost
 WHERE todos.id = $lost.id AND todos.id IN (SELECT id FROM $held_below)
   AND todos.state = 'pending'
RETURNING todos.id, todos.awaited

-- fragment: parent_failed(parent)
-- The result and error of a todo that was cancelled because `parent`, which it waited for (or
-- waited for through others), ended as a dead letter; requeue reads "parent" back.
jsonb_build_object('type', 'ParentFailed', 'parent', $parent,
    'message', 'Todo ' || $parent || ', which this todo waited for, ended as a dead letter.')
