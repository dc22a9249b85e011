-- Holding todos: what the owner of a claimed todo does with it: extend its lease (heartbeat,
-- heartbeat_many), end it (complete, complete_many, fail) or give it back (release); and the
-- mark that makes the statement ending a todo notify whoever waits for it (await_todo).
-- Format and conventions: shared.sql.

-- name: await_todo
-- Mark todo %(todo_id)s awaited while it is pending or claimed, so that the statement ending it
-- notifies its end (its "finished" CTE); no row when it has ended already, or does not exist.
-- Its row lock orders it with that statement: marked first, the end sees the mark; ended
-- first, no row.
UPDATE todos
   SET awaited = true
 WHERE id = %(todo_id)s AND state IN ('pending', 'claimed')
RETURNING id;

-- name: heartbeat
-- Extend the lease of a todo the owner still holds (lease_end), and keep %(progress)s as its
-- latest progress note (none given: the last one stays). Guard: claimed, same owner;
-- the receipt and the credential, when the caller names them (shared.sql).
UPDATE todos
   SET lease_expires_at = {{lease_end(todos)}},
       progress = coalesce(%(progress)s::jsonb, progress),
       updated_at = now()
 WHERE id = %(todo_id)s AND state = 'claimed' AND owner = %(owner)s
   AND {{under_receipt(todos)}} AND {{credential_holds}}
RETURNING *;

-- name: heartbeat_many
-- Extend the leases of many todos the owner holds, in one statement that never waits on a row
-- lock: a todo another session has locked (an operator's statement, a long transaction) is
-- skipped, and the caller tries it again at its next beat, well before the lease expires.
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
-- done, they are claimable now, in the same statement), found through todo_edges: one probe
-- of its primary key for a todo without children. Guard: claimed, same owner (the receipt and
-- the credential, when the caller names them: shared.sql). A child whose
-- creation raced this statement (created while it ran, not in its snapshot) is left to
-- repair_blocked (sql/operating.sql).
WITH completed AS (
UPDATE todos
   SET state = 'done', result = %(result)s::jsonb, lease_expires_at = NULL,
       completed_at = now(), updated_at = now()
 WHERE id = %(todo_id)s AND state = 'claimed' AND owner = %(owner)s
   AND {{under_receipt(todos)}} AND {{credential_holds}}
RETURNING *
),
waiting AS MATERIALIZED ({{locked_in_order(SELECT child_id FROM todo_edges WHERE parent_id = ANY (ARRAY(SELECT id FROM completed)))}}),
unblocked AS ({{unblocked(todo_edges WHERE parent_id = ANY (ARRAY(SELECT id FROM completed)), waiting)}}),
notified AS ({{notify_unblocked(unblocked)}}),
finished AS ({{notify_ended(completed WHERE awaited)}})
SELECT * FROM completed
 WHERE (SELECT count(*) FROM notified) >= 0 AND (SELECT count(*) FROM finished) >= 0;

-- name: complete_leaf
-- complete of a todo that no todo waits for, the common case: the same guard, result and
-- notification of its end (to whoever awaits it: notify_ended), in one UPDATE, without the
-- CTEs that unblock children, which cost a single complete more to start than to run. A todo
-- that some todo waits for (an edge in todo_edges, as complete finds them) is left alone: no
-- row, as for a miss, and the manager runs complete.
UPDATE todos
   SET state = 'done', result = %(result)s::jsonb, lease_expires_at = NULL,
       completed_at = now(), updated_at = now()
 WHERE id = %(todo_id)s AND state = 'claimed' AND owner = %(owner)s
   AND {{under_receipt(todos)}} AND {{credential_holds}}
   AND NOT EXISTS (SELECT FROM todo_edges WHERE parent_id = %(todo_id)s)
RETURNING *, CASE WHEN awaited THEN pg_notify('switchboard_todos_done', id) END AS ended;

-- name: complete_many
-- Mark many todos done, each with its own result, and unblock the todos waiting for them (as
-- complete does); returns the ids completed, and (done false) those still held that were left
-- alone (below), read only when something was left alone. %(results)s is one JSON object, id
-- to result (null: none): sent as one value, not as two arrays whose every element the client
-- escapes one by one.
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
 WHERE todos.id = mine.id
RETURNING todos.id, todos.awaited
),
waiting AS MATERIALIZED ({{locked_in_order(SELECT child_id FROM todo_edges WHERE parent_id = ANY (ARRAY(SELECT id FROM completed)))}}),
unblocked AS ({{unblocked(todo_edges WHERE parent_id = ANY (ARRAY(SELECT id FROM completed)), waiting)}}),
notified AS ({{notify_unblocked(unblocked)}}),
finished AS ({{notify_ended(completed WHERE awaited)}})
SELECT id, true AS done FROM completed
 WHERE (SELECT count(*) FROM notified) >= 0 AND (SELECT count(*) FROM finished) >= 0
UNION ALL
SELECT id, false AS done
  FROM todos
 WHERE (SELECT count(*) FROM completed) < (SELECT count(*) FROM jsonb_each(%(results)s::jsonb))
   AND id IN (SELECT jsonb_object_keys(%(results)s::jsonb))
   AND state = 'claimed' AND owner = %(owner)s
   AND id NOT IN (SELECT id FROM completed);

-- fragment: attempt_failed(entry, trimmed)
-- The SET list of the UPDATE that records a failed attempt of a todo (fail, fail_leaf): back
-- to pending after a backoff below the cap, a dead letter at it, its error the result. A retry
-- with a fair key takes a new turn (fair_turn): behind the todos its key already has waiting,
-- as a new one would. %(delays)s is the backoff schedule, one entry per attempt; the last entry
-- repeats; %(retry_in)s, when given, replaces it. The failure history's new entry (`entry`,
-- the statement's "entry" CTE) and what `trimmed` deleted are counted on the row (dropped,
-- grown).
state = CASE WHEN attempt >= max_attempts THEN 'failed' ELSE 'pending' END,
    next_retry_at = CASE WHEN attempt < max_attempts THEN now() + coalesce(
                        %(retry_in)s::interval,
                        make_interval(secs => (%(delays)s::float8[])[
                            least(attempt, cardinality(%(delays)s::float8[]))]))
                    END,
    fair_at = CASE WHEN attempt < max_attempts AND fair_key IS NOT NULL
                   THEN {{fair_turn(queue, priority, fair_key)}} ELSE fair_at END,
    owner = NULL,
    lease_expires_at = NULL,
    result = %(error)s::jsonb,
    errors_dropped = errors_dropped + {{dropped($trimmed, todos)}},
    errors_bytes = errors_bytes + {{grown($entry, $trimmed, todos)}},
    completed_at = CASE WHEN attempt >= max_attempts THEN now() END,
    updated_at = now()

-- name: fail
-- Record a failed attempt (attempt_failed), settling the todos that wait for it when it
-- becomes a dead letter (lost, in shared.sql). The todo is locked first ("held"), so that its
-- entry in the failure history is written with the owner and attempt that ended. Guard:
-- claimed, same owner; the credential, when the caller names one.
WITH held AS MATERIALIZED (
    SELECT id, owner, attempt, claimed_at
      FROM todos
     WHERE id = %(todo_id)s AND state = 'claimed' AND owner = %(owner)s
       AND {{credential_holds}}
       FOR NO KEY UPDATE
),
entry AS MATERIALIZED ({{error_entries(held, owner, %(error)s::jsonb)}}),
trimmed AS ({{trimmed(entry)}}),
noted AS ({{noted(entry)}}),
failed AS (
UPDATE todos
   SET {{attempt_failed(entry, trimmed)}}
 WHERE id = (SELECT id FROM held)
RETURNING *
),
lost AS MATERIALIZED ({{lost(failed WHERE state = 'failed')}}),
spared AS MATERIALIZED ({{spared(failed WHERE state = 'failed', lost)}}),
held_below AS MATERIALIZED ({{locked_in_order(SELECT id FROM lost UNION SELECT child_id FROM spared)}}),
entry_below AS MATERIALIZED ({{error_entries({{lost_held(lost, held_below)}}, NULL, {{parent_failed(parent)}})}}),
trimmed_below AS ({{trimmed(entry_below)}}),
noted_below AS ({{noted(entry_below)}}),
cancelled_below AS ({{cancelled_below(lost, held_below, entry_below, trimmed_below)}}),
waiting AS MATERIALIZED ({{locked_in_order(SELECT child_id FROM spared)}}),
unblocked AS ({{unblocked(spared, waiting)}}),
notified AS (
    SELECT pg_notify('switchboard_todos', queue)
      FROM (SELECT queue FROM failed WHERE state = 'pending' AND next_retry_at <= now()
            UNION SELECT queue FROM unblocked WHERE state = 'pending' AND waiting_for <= 0)
           AS woken
     WHERE %(notify)s
),
finished AS (
    SELECT pg_notify('switchboard_todos_done', id)
      FROM (SELECT id, awaited FROM failed WHERE state = 'failed'
            UNION ALL SELECT id, awaited FROM cancelled_below) AS ended
     WHERE awaited
)
SELECT * FROM failed
 WHERE (SELECT count(*) FROM notified) >= 0 AND (SELECT count(*) FROM finished) >= 0;

-- name: fail_leaf
-- fail of a todo that no todo waits for, the common case: the same guard, the same failed
-- attempt (attempt_failed) and the same history entry, trimmed alike, with its notifications
-- (a retry due at once to its queue's workers, a dead letter to whoever awaits it) sent from
-- the row it returns; without the CTEs that settle the todos waiting for a dead letter, which
-- cost a single fail more to start than to run. A todo that some todo waits for (an edge in
-- todo_edges, as lost and spared find them) is left alone: no row, as for a miss, and the
-- manager runs fail.
WITH held AS MATERIALIZED (
    SELECT id, owner, attempt, claimed_at
      FROM todos
     WHERE id = %(todo_id)s AND state = 'claimed' AND owner = %(owner)s
       AND {{credential_holds}}
       AND NOT EXISTS (SELECT FROM todo_edges WHERE parent_id = %(todo_id)s)
       FOR NO KEY UPDATE
),
entry AS MATERIALIZED ({{error_entries(held, owner, %(error)s::jsonb)}}),
trimmed AS ({{trimmed(entry)}}),
noted AS ({{noted(entry)}})
UPDATE todos
   SET {{attempt_failed(entry, trimmed)}}
 WHERE id = (SELECT id FROM held)
RETURNING *,
          CASE WHEN state = 'failed' AND awaited THEN pg_notify('switchboard_todos_done', id)
               WHEN state = 'pending' AND next_retry_at <= now() AND %(notify)s
               THEN pg_notify('switchboard_todos', queue) END AS notified;

-- name: release
-- Give the lease back without using up an attempt; claimable again after %(delay)s (zero: at
-- once), as a due todo: behind work already waiting, found by the scan of due todos whatever
-- the claim's low-water marks. With a fair key, it takes a new turn, as a retry does (fail).
-- Guard: claimed, same owner; the receipt and the credential, when the caller names them.
WITH released AS (
UPDATE todos
   SET state = 'pending',
       owner = NULL,
       lease_expires_at = NULL,
       attempt = greatest(attempt - 1, 0),
       next_retry_at = now() + %(delay)s::interval,
       fair_at = CASE WHEN fair_key IS NOT NULL THEN {{fair_turn(queue, priority, fair_key)}}
                 ELSE fair_at END,
       updated_at = now()
 WHERE id = %(todo_id)s AND state = 'claimed' AND owner = %(owner)s
   AND {{under_receipt(todos)}} AND {{credential_holds}}
RETURNING *
),
notified AS (
    SELECT pg_notify('switchboard_todos', queue)
      FROM released WHERE next_retry_at <= now() AND %(notify)s
)
SELECT * FROM released WHERE (SELECT count(*) FROM notified) >= 0;
