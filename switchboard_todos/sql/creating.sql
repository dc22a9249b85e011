-- Creating todos: one (create_todo), one waiting for others (create_child), a batch
-- (create_many), a graph of todos waiting for each other (create_graph), a schedule's tick
-- (tick_schedule), and what enqueue_many's COPY needs (queue_max_attempts, notify_queues).
-- Format and conventions: shared.sql.

-- fragment: max_attempts_of(given, queue)
-- A new todo's attempt budget: `given`, or when the caller gave none (NULL), the default of its
-- queue `queue` (todo_queues.max_attempts), else %(default_max_attempts)s. The queue's row is
-- read only when none was given: COALESCE evaluates an argument only when those before it
-- are NULL.
coalesce($given,
         (SELECT settings.max_attempts FROM todo_queues AS settings WHERE settings.name = $queue),
         %(default_max_attempts)s::int)

-- fragment: unless_key_held
-- An insert skips a todo whose (queue, idempotency_key) a live todo holds (idx_todos_dedupe).
ON CONFLICT (queue, idempotency_key)
   WHERE idempotency_key IS NOT NULL AND {{live(state)}}
DO NOTHING

-- fragment: inserted_columns
-- What the "inserted" CTE of a create returns: the columns of created_columns, and the queue
-- (its notification). Not `*`: the rest would be stored for the answer and never read.
id, queue, max_attempts, fair_at, next_retry_at, parents, waiting_for, on_parent_failure,
created_at, updated_at

-- fragment: todo_columns(todo)
-- Every column of `todo`, in the model's order: what a statement returns when its branches must
-- agree (created_then_held), which `*` (the table's physical order) does not promise.
$todo.id, $todo.queue, $todo.source, $todo.kind, $todo.title, $todo.payload, $todo.event_id,
$todo.idempotency_key, $todo.assignee, $todo.state, $todo.owner, $todo.lease_expires_at,
$todo.attempt, $todo.max_attempts, $todo.priority, $todo.concurrency_key, $todo.fair_key,
$todo.fair_at, $todo.slot,
$todo.next_retry_at, $todo.result, $todo.errors_dropped, $todo.errors_bytes, $todo.progress,
$todo.awaited, $todo.parents, $todo.waiting_for, $todo.on_parent_failure,
$todo.created_at, $todo.updated_at, $todo.claimed_at, $todo.completed_at, $todo.trace_context

-- fragment: created_columns(todo)
-- todo_columns of a todo just inserted, with NULL for the values its creator gave and for those
-- every new todo starts with (read as sql.CREATED_NULLS; the manager fills the first in from its
-- own parameters and the second, sql.CREATED_FRESH, from the columns' defaults): a create sends
-- back only what the database decided. `todo` holds inserted_columns.
$todo.id, NULL::text AS queue, NULL::text AS source, NULL::text AS kind, NULL::text AS title,
NULL::jsonb AS payload, NULL::text AS event_id, NULL::text AS idempotency_key,
NULL::text AS assignee, NULL::text AS state, NULL::text AS owner,
NULL::timestamptz AS lease_expires_at, NULL::int AS attempt, $todo.max_attempts,
NULL::smallint AS priority, NULL::text AS concurrency_key, NULL::text AS fair_key,
$todo.fair_at, NULL::smallint AS slot,
$todo.next_retry_at, NULL::jsonb AS result, NULL::int AS errors_dropped,
NULL::bigint AS errors_bytes,
NULL::jsonb AS progress, NULL::boolean AS awaited, $todo.parents, $todo.waiting_for,
$todo.on_parent_failure, $todo.created_at, $todo.updated_at,
NULL::timestamptz AS claimed_at, NULL::timestamptz AS completed_at,
NULL::text AS trace_context

-- fragment: created_then_held(inserted, notified)
-- The answer of a create, once its `notified` CTE has run: the todos of `inserted` (created,
-- without the values their creator gave: created_columns), then the rows of `todos` that the
-- FROM and WHERE clauses following it pick (the live todos holding the keys of those not
-- inserted; not created), whole.
SELECT {{created_columns($inserted)}}, true AS created
  FROM $inserted
 WHERE (SELECT count(*) FROM $notified) >= 0
UNION ALL
SELECT {{todo_columns(todos)}}, false AS created
  FROM todos

-- fragment: created_or_held(inserted, notified)
-- The answer of a statement that creates one todo: the todo of `inserted`, or else the live
-- todo that holds (%(queue)s, %(idempotency_key)s).
{{created_then_held($inserted, $notified)}}
 WHERE queue = %(queue)s
   AND idempotency_key = %(idempotency_key)s
   AND {{live(state)}}
   AND NOT EXISTS (SELECT FROM $inserted)

-- fragment: batch_rows(given)
-- The FROM item of a batch of new todos, `given` (fields, payload, n): %(rows)s, a JSON array of
-- one array per todo of its column values (batch_columns), zipped with %(payloads)s, a JSON
-- array of their payloads, and numbered (n, from 1). Two values, not an array per column:
-- psycopg escapes each element of an array in Python, which cost more than the insert itself.
ROWS FROM (jsonb_array_elements(%(rows)s::jsonb), jsonb_array_elements(%(payloads)s::jsonb))
    WITH ORDINALITY AS $given (fields, payload, n)

-- fragment: batch_columns(given)
-- The columns of a new todo of batch_rows `given`, by their place in its array of values.
$given.fields ->> 0 AS id, $given.fields ->> 1 AS queue, $given.fields ->> 2 AS source,
$given.fields ->> 3 AS kind, $given.fields ->> 4 AS title, $given.payload,
$given.fields ->> 5 AS event_id, $given.fields ->> 6 AS idempotency_key,
$given.fields ->> 7 AS assignee, ($given.fields ->> 8)::int AS max_attempts,
($given.fields ->> 9)::smallint AS priority, $given.fields ->> 10 AS concurrency_key,
($given.fields ->> 11)::timestamptz AS run_after, $given.fields ->> 12 AS fair_key, $given.n

-- fragment: batch_turns(batch)
-- The body of the "turned" CTE of a batch: the turn (fair_at) of each row of `batch` that has a
-- fair key. Each key's rows of the batch, in the batch's order, take steps of 1 ms from the
-- key's turn (fair_turn), probed once per key, queue and priority.
SELECT keyed.id,
       lane.start + (row_number() OVER (PARTITION BY keyed.queue, keyed.priority, keyed.fair_key
                                        ORDER BY keyed.n) - 1) * interval '1 millisecond'
           AS fair_at
  FROM $batch AS keyed
  JOIN (SELECT wanted.queue, wanted.priority, wanted.fair_key,
               {{fair_turn(wanted.queue, wanted.priority, wanted.fair_key)}} AS start
          FROM (SELECT DISTINCT queue, priority, fair_key FROM $batch WHERE fair_key IS NOT NULL)
               AS wanted
       ) AS lane
    ON lane.queue = keyed.queue AND lane.priority = keyed.priority
   AND lane.fair_key = keyed.fair_key

-- fragment: own_turn
-- The turn (fair_at) of a new todo of create_todo's parameters: its creation time without a
-- fair key, its key's turn with one (fair_turn).
CASE WHEN %(fair_key)s::text IS NULL THEN now()
     ELSE {{fair_turn(%(queue)s, %(priority)s::smallint, %(fair_key)s::text)}} END

-- fragment: parents_read(ids)
-- The body of the "parent" CTE of a creation: the existing todos in `ids` (a text[]) a new todo
-- waits for, read in the statement's snapshot and neither locked nor written: naming a parent
-- costs it nothing, however many children it has (issue 35). A parent that ends while the
-- statement runs may be counted as not ended, and the statement ending it, whose snapshot
-- predates the child, does not unblock it: repair_blocked (sql/operating.sql) recounts such a
-- child at the reaper's next sweep.
SELECT id, state
  FROM todos
 WHERE id = ANY ($ids)

-- fragment: waited(parent)
-- How many of the rows of `parent` (a FROM item of id, state: parents_read) a new todo waits
-- for: those neither done nor failed.
count(*) FILTER (WHERE $parent.state IN ('pending', 'claimed'))

-- fragment: usable(parent, wanted)
-- Whether the parents a new todo names (`wanted`, a text[]) all exist, and none is a dead letter:
-- a todo does not wait for what will never be done (requeue it first).
count(*) = cardinality($wanted) AND count(*) FILTER (WHERE $parent.state = 'failed') = 0

-- name: create_todo
-- Insert a pending todo, or return the live todo that already holds (queue, idempotency_key).
-- Without %(max_attempts)s (NULL), the todo takes its queue's default (max_attempts_of).
-- %(trace_context)s: its creator's trace context (tracing.py), NULL when none was active.
WITH inserted AS (
    INSERT INTO todos (queue, source, kind, title, payload, event_id, idempotency_key,
                       assignee, max_attempts, priority, concurrency_key, fair_key, fair_at,
                       next_retry_at, trace_context)
    VALUES (%(queue)s, %(source)s, %(kind)s, %(title)s, %(payload)s::jsonb, %(event_id)s,
            %(idempotency_key)s, %(assignee)s,
            {{max_attempts_of(%(max_attempts)s::int, %(queue)s)}},
            %(priority)s, %(concurrency_key)s, %(fair_key)s, {{own_turn}},
            CASE WHEN %(run_after)s::timestamptz > now() THEN %(run_after)s::timestamptz END,
            %(trace_context)s::text)
    {{unless_key_held}}
    RETURNING {{inserted_columns}}
),
notified AS (
    SELECT pg_notify('switchboard_todos', queue)
      FROM inserted WHERE next_retry_at IS NULL AND %(notify)s
)
{{created_or_held(inserted, notified)}};

-- name: create_child
-- Insert a pending todo %(id)s that waits for the todos %(parents)s, or return the live todo that
-- already holds (queue, idempotency_key). The parents are read, not locked (parents_read): the
-- todo waits for those neither done nor failed, and is not claimable while it waits
-- (next_retry_at in the year 9999, the "blocked" fragment: at the end of idx_todos_scheduled,
-- where no claim's scan of due todos reaches). Once inserted, one row of todo_edges per parent
-- links it: the parents' rows are not touched. Nothing is written when a parent is missing or a
-- dead letter: the manager says which. Without %(max_attempts)s, the queue's default
-- (max_attempts_of).
WITH parent AS MATERIALIZED ({{parents_read(%(parents)s::text[])}}),
waiting AS MATERIALIZED (
    SELECT {{waited(parent)}} AS count
      FROM parent
    HAVING {{usable(parent, %(parents)s::text[])}}
),
inserted AS (
    INSERT INTO todos (id, queue, source, kind, title, payload, event_id, idempotency_key,
                       assignee, max_attempts, priority, concurrency_key, fair_key, fair_at,
                       parents, waiting_for, on_parent_failure, next_retry_at, trace_context)
    SELECT %(id)s, %(queue)s, %(source)s, %(kind)s, %(title)s, %(payload)s::jsonb, %(event_id)s,
           %(idempotency_key)s, %(assignee)s,
           {{max_attempts_of(%(max_attempts)s::int, %(queue)s)}},
           %(priority)s, %(concurrency_key)s, %(fair_key)s, {{own_turn}}, %(parents)s::text[],
           waiting.count,
           %(on_parent_failure)s, CASE WHEN waiting.count > 0 THEN {{blocked}} END,
           %(trace_context)s::text
      FROM waiting
    {{unless_key_held}}
    RETURNING {{inserted_columns}}
),
linked AS (
    INSERT INTO todo_edges (parent_id, child_id)
    SELECT parent.id, inserted.id
      FROM parent, inserted
),
notified AS (
    SELECT pg_notify('switchboard_todos', queue)
      FROM inserted WHERE next_retry_at IS NULL AND %(notify)s
)
{{created_or_held(inserted, notified)}};

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
-- Every todo of the batch has the one trace context of its creator, %(trace_context)s.
WITH batch AS (
    SELECT {{batch_columns(given)}}
      FROM {{batch_rows(given)}}
),
defaults AS MATERIALIZED (
    SELECT settings.name, settings.max_attempts
      FROM todo_queues AS settings
     WHERE settings.name IN (SELECT queue FROM batch WHERE max_attempts IS NULL)
),
turned AS MATERIALIZED ({{batch_turns(batch)}}),
inserted AS (
    INSERT INTO todos (id, queue, source, kind, title, payload, event_id, idempotency_key,
                       assignee, max_attempts, priority, concurrency_key, fair_key, fair_at,
                       next_retry_at, trace_context)
    SELECT batch.id, batch.queue, source, kind, title, payload, event_id, idempotency_key,
           assignee,
           coalesce(batch.max_attempts, defaults.max_attempts, %(default_max_attempts)s::int),
           batch.priority, concurrency_key, batch.fair_key, coalesce(turned.fair_at, now()),
           CASE WHEN run_after > now() THEN run_after END, %(trace_context)s::text
      FROM batch
      LEFT JOIN defaults ON defaults.name = batch.queue
      LEFT JOIN turned ON turned.id = batch.id
    {{unless_key_held}}
    RETURNING id, queue, next_retry_at, fair_key, fair_at
),
notified AS (
    SELECT pg_notify('switchboard_todos', queue)
      FROM (SELECT DISTINCT queue FROM inserted WHERE next_retry_at IS NULL AND %(notify)s)
           AS claimable
)
SELECT now() AS now,
       (SELECT jsonb_object_agg(name, max_attempts) FROM defaults) AS defaults,
       ARRAY(SELECT id
               FROM batch
              WHERE idempotency_key IS NOT NULL
                AND id NOT IN (SELECT id FROM inserted)) AS missed,
       scheduled.ids AS scheduled, scheduled.next_retry_at, keyed.ids AS keyed, keyed.fair_at
  FROM (SELECT array_agg(id) AS ids, array_agg(next_retry_at) AS next_retry_at
          FROM inserted
         WHERE next_retry_at IS NOT NULL) AS scheduled,
       (SELECT array_agg(id) AS ids, array_agg(fair_at) AS fair_at
          FROM inserted
         WHERE fair_key IS NOT NULL) AS keyed
 WHERE (SELECT count(*) FROM notified) >= 0;

-- name: create_graph
-- Insert many todos, some waiting for others of the batch or for existing todos: the whole
-- batch or nothing (the manager runs it in a transaction, and rolls it back when a member's key
-- is held by a live todo). Each row gives, after create_many's columns (batch_rows), its parents
-- (a JSON array of ids), how many of them are members (new, so not done), and its policy. The
-- existing parents, %(existing)s, are read, not locked, as create_child does (parents_read);
-- nothing is inserted when one is missing or a dead letter. Each todo inserted is linked to
-- each of its parents, members or not, by a row of todo_edges. A row without max_attempts takes
-- its queue's default (max_attempts_of). The answer: one notification per queue, and the todos
-- inserted (created, without what their creator gave) beside the live todos that hold the keys
-- of those that were not (not created), whole.
WITH batch AS (
    SELECT {{batch_columns(given)}}, given.fields -> 13 AS parents,
           (given.fields ->> 14)::int AS members_waited, given.fields ->> 15 AS policy
      FROM {{batch_rows(given)}}
),
parent AS MATERIALIZED ({{parents_read(%(existing)s::text[])}}),
usable AS MATERIALIZED (
    SELECT {{usable(parent, %(existing)s::text[])}} AS ok
      FROM parent
),
turned AS MATERIALIZED ({{batch_turns(batch)}}),
inserted AS (
    INSERT INTO todos (id, queue, source, kind, title, payload, event_id, idempotency_key,
                       assignee, max_attempts, priority, concurrency_key, fair_key, fair_at,
                       parents, waiting_for, on_parent_failure, next_retry_at, trace_context)
    SELECT batch.id, queue, source, kind, title, payload, event_id, idempotency_key, assignee,
           {{max_attempts_of(batch.max_attempts, batch.queue)}}, priority, concurrency_key,
           batch.fair_key, coalesce(turned.fair_at, now()),
           nullif(ARRAY(SELECT jsonb_array_elements_text(batch.parents)), '{}'),
           members_waited + waiting.existing, policy,
           CASE WHEN members_waited + waiting.existing > 0 THEN {{blocked}} END,
           %(trace_context)s::text
      FROM batch
      LEFT JOIN turned ON turned.id = batch.id
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
    INSERT INTO todo_edges (parent_id, child_id)
    SELECT edge.parent_id, inserted.id
      FROM inserted
     CROSS JOIN LATERAL unnest(inserted.parents) AS edge (parent_id)
),
notified AS (
    SELECT pg_notify('switchboard_todos', queue)
      FROM (SELECT DISTINCT queue FROM inserted WHERE next_retry_at IS NULL AND %(notify)s)
           AS claimable
)
{{created_then_held(inserted, notified)}}
  JOIN batch ON todos.queue = batch.queue AND todos.idempotency_key = batch.idempotency_key
 WHERE {{live(todos.state)}}
   AND batch.id NOT IN (SELECT id FROM inserted);

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
notified AS (
    SELECT pg_notify('switchboard_todos', queue)
      FROM inserted WHERE %(notify)s
)
SELECT * FROM inserted WHERE (SELECT count(*) FROM notified) >= 0;

-- name: queue_max_attempts
-- The default max_attempts of those of %(queues)s that have one (todo_queues): enqueue_many
-- reads them before its COPY, which cannot look them up row by row.
SELECT name, max_attempts
  FROM todo_queues
 WHERE name = ANY (%(queues)s::text[]) AND max_attempts IS NOT NULL;

-- name: fair_turns
-- The turn (fair_turn) of each fair key %(keys)s at its queue %(queues)s and priority
-- %(priorities)s, beside the database's now(): enqueue_many reads them before its COPY, which
-- cannot look them up row by row, and numbers each key's rows from there.
SELECT now(), wanted.queue, wanted.priority, wanted.fair_key,
       {{fair_turn(wanted.queue, wanted.priority, wanted.fair_key)}} AS start
  FROM unnest(%(queues)s::text[], %(priorities)s::smallint[], %(keys)s::text[])
       AS wanted (queue, priority, fair_key);

-- name: notify_queues
-- Wake the workers of %(queues)s, on commit: enqueue_many's COPY cannot notify by itself.
SELECT pg_notify('switchboard_todos', queue) FROM unnest(%(queues)s::text[]) AS woken (queue);
