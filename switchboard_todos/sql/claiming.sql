-- Claiming todos: the claim of the next todos of some queues (claim_next), of those an ORM
-- queryset picks (claim_filtered), and of one todo by id (claim). Each claim reads and
-- enforces its queues' pause, rate and concurrency limits ("room"), takes a free slot in a
-- queue with a concurrency limit ("free_slot", "slot"), leases what it took ("claimed") and
-- counts it against the limits ("counted"). Format and conventions: shared.sql.

-- fragment: key_free(todo)
-- `todo` (a row of todos) has no concurrency key, or no other claimed todo holds its key. The
-- database settles two claims that both saw the key free: idx_todos_key_claimed lets only one
-- claimed todo hold a key, and the claim that loses runs again (managers/claiming.py).
($todo.concurrency_key IS NULL OR NOT EXISTS (
     SELECT FROM todos AS holder
      WHERE holder.concurrency_key = $todo.concurrency_key AND holder.state = 'claimed'
        AND holder.id <> $todo.id))

-- fragment: room(queues)
-- The body of the "room" CTE of a claim: each queue of `queues` (a text[]) whose todo_queues row
-- pauses or limits it, with how many todos this claim may take from it (room_of). Those rows
-- are locked, so the claims of a limited queue run one at a time, and each reads the row as
-- the one before it left it (the rate count), even if it changed after this statement began.
-- Queues without such a row are not here: nothing limits them, and nothing is locked.
SELECT settings.name AS queue, settings.concurrency_limit, settings.slot_cursor,
       {{room_of(settings)}} AS room
{{limiting($queues)}}
   FOR NO KEY UPDATE

-- fragment: limiting(queues)
-- The FROM and WHERE of a read of the todo_queues rows ("settings") of `queues` (a text[])
-- that pause their queue or limit its claims: the full claims read and lock them (room, after
-- claim_turn), the lean ones only look (their "limited").
  FROM todo_queues AS settings
 WHERE settings.name = ANY ($queues)
   AND (settings.paused OR settings.rate_limit IS NOT NULL OR settings.concurrency_limit IS NOT NULL)

-- fragment: first_per_key(ready, due, expired)
-- The body of the "first_per_key" CTE of a claim: of the candidates of its `ready`, `due` and
-- `expired` scans, the first of each concurrency key by priority, then claimable time, and
-- all those without a key. The candidates without a key skip the window that would number
-- them: the common claim sorts its candidates once (in "picked").
SELECT id, queue, priority, claimable_at
  FROM (SELECT * FROM $ready UNION ALL SELECT * FROM $due UNION ALL SELECT * FROM $expired)
       AS claimable
 WHERE concurrency_key IS NULL
UNION ALL
SELECT id, queue, priority, claimable_at
  FROM (SELECT *, row_number() OVER (PARTITION BY concurrency_key
                                     ORDER BY priority DESC, claimable_at) AS nth
          FROM (SELECT * FROM $ready UNION ALL SELECT * FROM $due
                UNION ALL SELECT * FROM $expired) AS claimable
         WHERE concurrency_key IS NOT NULL
       ) AS keyed
 WHERE nth = 1

-- fragment: picked(first_per_key, room)
-- The body of the "picked" CTE of a claim: of `first_per_key`, the first %(limit)s by
-- priority, then claimable time, taking no more from a queue than its `room`; with
-- %(max_held)s, only as many as bring the todos %(owner)s holds up to it (counted only then, on
-- idx_todos_held). `in_queue` numbers the picks of each queue in `room` in claim order (NULL
-- elsewhere); the candidates of queues nothing limits skip that window.
SELECT id, queue, priority, claimable_at, in_queue
  FROM (SELECT *, NULL::bigint AS in_queue
          FROM $first_per_key
         WHERE queue NOT IN (SELECT queue FROM $room)
        UNION ALL
        SELECT *
          FROM (SELECT *, row_number() OVER (PARTITION BY queue
                                             ORDER BY priority DESC, claimable_at) AS in_queue
                  FROM $first_per_key
                 WHERE queue IN (SELECT queue FROM $room)
               ) AS limited
         WHERE in_queue <= coalesce((SELECT $room.room FROM $room
                                      WHERE $room.queue = limited.queue), in_queue)
       ) AS per_queue
 ORDER BY priority DESC, claimable_at
 LIMIT {{held_room(%(limit)s::int)}}

-- fragment: held_room(limit)
-- How many todos a claim of at most `limit` may take: `limit`, or with %(max_held)s, only as
-- many as bring the todos %(owner)s holds up to it (counted only then, on idx_todos_held).
(SELECT CASE WHEN (SELECT %(max_held)s::int) IS NULL THEN $limit
        ELSE greatest(0, least($limit, (SELECT %(max_held)s::int) - (
                 SELECT count(*) FROM todos AS held
                  WHERE held.state = 'claimed' AND held.owner = %(owner)s)::int))
        END)

-- fragment: free_slot(room, limit)
-- The body of the "free_slot" CTE of a claim: for each queue of `room` with a concurrency
-- limit, its free slots (1 to the limit) that no claimed todo of the queue holds, numbered
-- (nth), which the claim's "slot" CTE hands to its picks in turn (in_queue). The index is
-- probed for each number only until the claim has as many as it may take (at most `limit`).
-- The probe starts at the queue's slot_cursor, where the claim before it stopped (counted
-- moves it), and goes round: the claims of a limited queue run one at a time (room), but each
-- reads the claimed todos in the snapshot it began with, blind to the slots the claim it
-- waited for took; from slot 1 on, it picked those again, hit idx_todos_slot, and ran again
-- (managers/claiming.py), as two claims racing for a concurrency key do. `step` counts from 0
-- round the ring of slots, from where the queue's cursor was. Each slot is one probe of
-- idx_todos_slot: the "OFFSET 0" keeps the NOT EXISTS a subplan run per slot, which the
-- planner would otherwise make an anti-join, and on statistics gathered while the queue held
-- nothing, one that read every claimed todo of the queue once per slot tried (3,600 held and a
-- claim of 400: 1.4 million rows, 122 ms, in the section the queue's claims take one at a
-- time).
SELECT $room.queue, free.step, free.slot, row_number() OVER (PARTITION BY $room.queue) AS nth
  FROM $room
 CROSS JOIN LATERAL (
        SELECT step, ring.slot
          FROM generate_series(0, $room.concurrency_limit - 1) AS step
         CROSS JOIN LATERAL (
                SELECT mod($room.slot_cursor + step, $room.concurrency_limit) + 1 AS slot
               ) AS ring
         WHERE NOT EXISTS (
                SELECT FROM todos AS holder
                 WHERE holder.queue = $room.queue AND holder.state = 'claimed'
                   AND holder.slot = ring.slot
                OFFSET 0)
         LIMIT least($room.room, $limit)
       ) AS free
 WHERE $room.concurrency_limit IS NOT NULL

-- fragment: taken_over(ids)
-- The body of a claim's "taken_over" CTE: of the todos `ids` (a SELECT of ids) it is about to
-- claim, those whose expired lease it takes over, locked in id order as they are now; the
-- claim records each expired attempt in the failure history (its "entry", "trimmed" and
-- "noted" CTEs: error_entries), as the reaper does. The "EXISTS", a test made once, skips the
-- scan when there are no such ids, as in every claim that does not look for expired leases:
-- on statistics gathered while the queue held nothing, the generic plan read idx_todos_held
-- for them, every claimed todo (1.4 ms for 3,600 held, in a limited queue's claim, which its
-- queue's claims wait for).
SELECT id, owner, attempt, claimed_at
  FROM todos
 WHERE id = ANY (ARRAY($ids))
   AND state = 'claimed' AND lease_expires_at <= now() AND attempt < max_attempts
   AND (assignee IS NULL OR assignee = %(owner)s)
   AND EXISTS ($ids)
 ORDER BY id
   FOR NO KEY UPDATE

-- fragment: leased_to_owner
-- What every claim of a queue's todos writes to each: the lease to %(owner)s (lease_end), one
-- more attempt.
state = 'claimed',
owner = %(owner)s,
lease_expires_at = {{lease_end(todos)}},
attempt = attempt + 1,
claimed_at = now(),
next_retry_at = NULL,
updated_at = now()

-- fragment: set_claimed(slot, entry, trimmed)
-- What a claim writes: the lease to %(owner)s (lease_end), one more attempt, its slot in a
-- queue with a concurrency limit (of `slot`, id to slot). A claim that takes over an expired
-- lease counts its failure history's new entry (`entry`) and the entries `trimmed` deleted
-- (taken_over). The slots
-- are gathered once into a JSON object, id to slot, that each row looks itself up in: a
-- subquery over `slot` per row read the whole CTE for each todo claimed, a cost that grew
-- with the square of the batch.
SET {{leased_to_owner}},
    errors_dropped = CASE WHEN state = 'claimed'
                          THEN errors_dropped + {{dropped($trimmed, todos)}}
                          ELSE errors_dropped END,
    errors_bytes = CASE WHEN state = 'claimed'
                        THEN errors_bytes + {{grown($entry, $trimmed, todos)}}
                        ELSE errors_bytes END,
    slot = ((SELECT jsonb_object_agg($slot.id, $slot.slot) FROM $slot) ->> todos.id)::smallint

-- fragment: counted(claimed, slot, room)
-- The body of the "counted" CTE of a claim: the todos of `claimed` from each rate-limited
-- queue (of `room`) added to its rate window's count (a new window starts again from zero),
-- unless a later claim has closed the window this one began in; and the slot cursor of each
-- queue with a concurrency limit moved past the last slot it took (of `slot`).
UPDATE todo_queues AS settings
   SET rate_count = CASE WHEN NOT {{counts_rate(settings)}} THEN settings.rate_count
                         WHEN settings.rate_window = {{rate_window(settings)}}
                         THEN settings.rate_count + claims.count
                         ELSE claims.count END,
       rate_window = CASE WHEN {{counts_rate(settings)}} THEN {{rate_window(settings)}}
                          ELSE settings.rate_window END,
       slot_cursor = coalesce(mod(settings.slot_cursor + claims.last_step + 1,
                                  settings.concurrency_limit), settings.slot_cursor)
  FROM (SELECT $claimed.queue, count(*) AS count, max($slot.step) AS last_step
          FROM $claimed
          LEFT JOIN $slot ON $slot.id = $claimed.id
         WHERE $claimed.queue IN (SELECT queue FROM $room)
         GROUP BY $claimed.queue) AS claims
 WHERE settings.name = claims.queue
   AND ({{counts_rate(settings)}} OR claims.last_step IS NOT NULL)

-- fragment: counts_rate(settings)
-- Whether a claim adds what it took to the rate window of `settings` (a todo_queues row): the
-- queue has a rate limit, and no later claim has closed the window this statement is in.
($settings.rate_limit IS NOT NULL
 AND ($settings.rate_window IS NULL OR $settings.rate_window <= {{rate_window($settings)}}))

-- fragment: ready_scan(queue, priorities, mark, cap)
-- claim_next's scan of the ready todos of `queue` at the `priorities` (a condition on the
-- column), from the turn `mark` on: in claim order (priority, then turn), each locked as it is
-- read, under the constant limit `cap` explained at claim_next. With a fixed priority, the
-- B-tree seeks to the mark. A todo with a concurrency key is taken only if no ready todo with
-- its key comes before it (higher priority, then older, then lower id): so the todos of one
-- key are claimed in order, even while a concurrent claim holds the first one locked
-- (idx_todos_key_order).
SELECT * FROM (
    SELECT id, priority, concurrency_key, fair_at
      FROM todos
     WHERE state = 'pending' AND next_retry_at IS NULL
       AND queue = $queue AND $priorities
       AND fair_at >= $mark
       AND (assignee IS NULL OR assignee = (SELECT %(owner)s::text))
       AND {{key_free(todos)}}
       AND (todos.concurrency_key IS NULL OR NOT EXISTS (
                SELECT FROM todos AS earlier
                 WHERE earlier.concurrency_key = todos.concurrency_key
                   AND earlier.state = 'pending' AND earlier.next_retry_at IS NULL
                   AND (-earlier.priority, earlier.created_at, earlier.id)
                       < (-todos.priority, todos.created_at, todos.id)))
     ORDER BY priority DESC, fair_at
     LIMIT $cap
       FOR UPDATE SKIP LOCKED
) AS scan

-- fragment: claimed_in_order(claimed, picked, ready, limited)
-- What claim_next and claim_ready return: the todos `claimed`, in claim order (their ranks in
-- `picked`), each with its ready_turn (its turn if it came from `ready`, else NULL: the marks
-- move on those, claims/marks.py); and a row of NULLs when `limited` (a CTE of the queues a
-- todo_queues row pauses or limits) has a row, which tells the manager that the claim's queues
-- are limited: the next claim from them runs claim_next, not the lean claim_ready.
SELECT *
  FROM (SELECT $claimed.*,
               CASE WHEN $claimed.id IN (SELECT id FROM $ready) THEN $picked.claimable_at END
                   AS ready_turn,
               $picked.priority AS ranked_priority, $picked.claimable_at AS ranked_at
          FROM $claimed JOIN $picked ON $picked.id = $claimed.id
        UNION ALL
        SELECT (NULL::todos).*, NULL, NULL, NULL
         WHERE EXISTS (SELECT FROM $limited)) AS taken
 ORDER BY ranked_priority DESC, ranked_at

-- fragment: ready_todos(room, cap)
-- The body of a claim's "ready" CTE: the ready todos of each queue of %(queues)s, locked, in
-- claim order from its marks (ready_scans, each under the constant limit `cap`), each queue as
-- far as %(limit)s and its room (the statement's `room` CTE: nothing limits a queue without a
-- row there).
SELECT candidate.id, wanted.queue, candidate.priority, candidate.concurrency_key,
       candidate.fair_at AS claimable_at
  FROM unnest((SELECT %(queues)s::text[]), (SELECT %(marks)s::timestamptz[]),
              (SELECT %(tops)s::int[]), (SELECT %(bottoms)s::int[]))
       AS wanted (queue, mark, top, bottom)
  LEFT JOIN $room ON $room.queue = wanted.queue
 CROSS JOIN LATERAL (
        SELECT * FROM ({{ready_scans(wanted, $cap)}}) AS locked
        LIMIT least((SELECT %(limit)s::int), $room.room)
       ) AS candidate

-- fragment: ready_scans(wanted, cap)
-- The ready todos of the queue of `wanted` (a row of a claim's queues with the mark, top and
-- bottom of its scans), locked, in claim order from its marks (ready_scan; claim_next says
-- which), each scan under the constant limit `cap`: the priorities above its top from its
-- mark, each priority of its group marks from its own, then those below its bottom from its
-- mark.
{{ready_scan($wanted.queue, priority > $wanted.top, $wanted.mark, $cap)}}
UNION ALL
SELECT known.*
  FROM unnest((SELECT %(group_queues)s::text[]),
              (SELECT %(group_priorities)s::int[]),
              (SELECT %(group_marks)s::timestamptz[]))
       AS grp (queue, priority, mark)
 CROSS JOIN LATERAL (
        {{ready_scan(grp.queue, priority = grp.priority, grp.mark, $cap)}}
       ) AS known
 WHERE grp.queue = $wanted.queue
UNION ALL
{{ready_scan($wanted.queue, priority < $wanted.bottom, $wanted.mark, $cap)}}

-- fragment: due_retry(queue)
-- The condition of the claims' scans of due retries (their "due" CTEs), all but the test of
-- the state, which is the claim's guard and so is written in the claim (transitions.py): a
-- todo of `queue` whose retry fell due, assigned to no one or to %(owner)s, whose concurrency
-- key no other claimed todo holds (key_free).
next_retry_at IS NOT NULL
  AND queue = $queue
  AND next_retry_at <= now()
  AND (assignee IS NULL OR assignee = (SELECT %(owner)s::text))
  AND {{key_free(todos)}}

-- name: claim_turn
-- Wait for a claim's turn at the todo_queues rows that pause or limit %(queues)s, and keep
-- them locked: sent ahead of claim_next in the same round trip, in the same transaction
-- (managers/claiming.py, cursors.one_round_trip), where the claim's own "room" then finds them
-- already held. The claims of a limited queue run one at a time, each locking its queue's row
-- (room). One that waited there inside its own statement scanned in the snapshot it began
-- with, where the todos the claims ahead of it took since still look pending: it tried to lock
-- each again and passed over it, 3,200 rows for a claim of 400 at 4 processes
-- (docs/benchmarks.md). Waiting here instead, the claim begins once its turn has come, and its
-- snapshot holds what the claims ahead took. In name order, as two claims of overlapping
-- queues then lock.
SELECT settings.name
{{limiting((SELECT %(queues)s::text[])::text[])}}
 ORDER BY settings.name
   FOR NO KEY UPDATE;

-- name: claim_next(cap=1000), claim_next_few(cap=100)
-- Claim up to %(limit)s of the claimable todos in %(queues)s for %(owner)s: the highest
-- priority first, then the earliest turn (fair_at: a todo's creation time without a fair key;
-- with one, its key's turn, so that the keys take turns, fair_turn in shared.sql). Each queue
-- is its own index scan (in priority, then turn order) that stops at the first unlocked rows,
-- so the cost does not grow with the backlog, nor with the number of keys; a plain
-- "queue = ANY(...) ORDER BY" would sort the whole backlog. Retries that fell due and expired
-- leases come from their own scans, in the order they became claimable, up to %(limit)s each,
-- and rank at their turn or when they became claimable, whichever is later; all candidates are
-- then ranked by priority and that time. The answer's ready_turn is the turn of each todo
-- taken from the ready scans (NULL for the others), from which the marks move. A todo
-- whose concurrency key another claimed todo holds is passed over, and of candidates sharing a
-- key only the first is taken, so one key is never claimed twice. The scan of a queue's ready
-- todos starts at low-water marks of turns (claims/marks.py): each priority this process has
-- claimed from, %(group_priorities)s of %(group_queues)s, from its own mark, %(group_marks)s; the priorities
-- above %(tops)s and below %(bottoms)s from the queue's mark, %(marks)s (year 1: from the head
-- of the index); in priority order, and only as far as the limit needs. Expired leases are
-- looked for only when %(full_scan)s. A paused queue is not scanned at all, and a limited
-- one only as far as its room (the "room" CTE: the pause, rate and concurrency limits of the
-- queues' todo_queues rows, read and enforced in this statement).
-- Written for a prepared claim to keep one generic plan (cursors.py), not to be planned anew
-- at each call, which costs more than running it. So the planner must not see the queues,
-- the marks, the owner, the limit or whether it is a full scan, all read through
-- "(SELECT ...)": every call then gets the same plan, and the generic one wins. Each scan
-- locks rows under a constant limit, its cap ($cap), and yields them to the real limit above
-- it, which stops pulling, hence locking, at %(limit)s rows. The constant keeps the plan's
-- estimated cost small however large the backlog, which keeps PostgreSQL from JIT-compiling
-- the plan at every call. And "= ANY (ARRAY(...))" keeps the update on the primary key
-- whatever the planner expects.
-- The cap is 1000 in claim_next (the largest claim_batch limit), 100 in claim_next_few (run
-- for limits up to 100) and 1 in claim_one. A queue that this process has no mark for is
-- scanned over a range of priorities from the head of its index, and the generic plan expects
-- a ninth of the queue's todos there (an unknown bound on the priority and one on the turn, a
-- third each). While that is below the cap, the planner reads them all in a bitmap scan and
-- sorts them, which it judges cheaper than the index's order: under a cap of 1000, the whole
-- backlog of a queue of up to some 9,000 todos, at each claim, for a worker that serves
-- several queues (bench/claim_scale.py: 360 claims a second from three queues against 1,450
-- from one). Under a cap near the limit, which it can be sure to stop at, it follows the index.
WITH room AS MATERIALIZED ({{room((SELECT %(queues)s::text[])::text[])}}),
ready AS MATERIALIZED ({{ready_todos(room, $cap)}}),
due AS MATERIALIZED (
    SELECT candidate.id, wanted.queue, candidate.priority, candidate.concurrency_key,
           greatest(candidate.fair_at, candidate.next_retry_at) AS claimable_at
      FROM unnest((SELECT %(queues)s::text[])) AS wanted (queue)
      LEFT JOIN room ON room.queue = wanted.queue
     CROSS JOIN LATERAL (
            SELECT * FROM (
                SELECT id, priority, concurrency_key, next_retry_at, fair_at
                  FROM todos
                 WHERE state = 'pending' AND {{due_retry(wanted.queue)}}
                 ORDER BY next_retry_at
                 LIMIT $cap
                   FOR UPDATE SKIP LOCKED
            ) AS locked
            LIMIT least((SELECT %(limit)s::int), room.room)
           ) AS candidate
),
expired AS MATERIALIZED (
    SELECT * FROM (
        SELECT id, queue, priority, concurrency_key,
               greatest(fair_at, lease_expires_at) AS claimable_at
          FROM todos
         WHERE (SELECT %(full_scan)s::bool) AND state = 'claimed'
           AND lease_expires_at <= now()
           AND attempt < max_attempts
           AND queue = ANY ((SELECT %(queues)s::text[])::text[])
           AND (assignee IS NULL OR assignee = (SELECT %(owner)s::text))
         ORDER BY lease_expires_at
         LIMIT $cap
           FOR UPDATE SKIP LOCKED
    ) AS locked
    LIMIT (SELECT %(limit)s::int)
),
first_per_key AS MATERIALIZED ({{first_per_key(ready, due, expired)}}),
picked AS MATERIALIZED ({{picked(first_per_key, room)}}),
free_slot AS MATERIALIZED ({{free_slot(room, (SELECT %(limit)s::int))}}),
slot AS MATERIALIZED (
    SELECT picked.id, free_slot.step, free_slot.slot
      FROM picked
      JOIN free_slot ON free_slot.queue = picked.queue AND free_slot.nth = picked.in_queue
),
taken_over AS MATERIALIZED ({{taken_over(SELECT id FROM picked WHERE id IN (SELECT id FROM expired))}}),
entry AS MATERIALIZED ({{error_entries(taken_over, owner, {{lease_expired}})}}),
trimmed AS ({{trimmed(entry)}}),
noted AS ({{noted(entry)}}),
claimed AS (
    UPDATE todos
       {{set_claimed(slot, entry, trimmed)}}
     WHERE id = ANY (ARRAY(SELECT id FROM picked)) AND {{credential_holds}}
    RETURNING todos.*
),
counted AS ({{counted(claimed, slot, room)}})
{{claimed_in_order(claimed, picked, ready, room)}};

-- name: claim_ready(cap=1000), claim_ready_few(cap=100)
-- claim_next, lean, for the common case: queues that no todo_queues row pauses or limits, and
-- a claim that does not look for expired leases (not a full scan). The same ready and due
-- scans, the same concurrency keys, turns and %(max_held)s, without what only limits and
-- taken-over leases need (room's lock, slots, the rate count, the failure history), which
-- cost the claim of one todo most of its time in the executor. Whether a queue is paused or
-- limited is read in the statement ("limited", unlocked, as the snapshot has it: a pause that
-- commits while this runs comes after it): if one is, it claims nothing, and says so
-- (claimed_in_order), and the manager claims with claim_next. Its scans lock under $cap, as
-- claim_next's: 1000 in claim_ready, 100 in claim_ready_few.
WITH limited AS MATERIALIZED (
    SELECT settings.name
    {{limiting((SELECT %(queues)s::text[])::text[])}}
),
room AS MATERIALIZED (
    SELECT wanted.queue, 0 AS room
      FROM unnest((SELECT %(queues)s::text[])) AS wanted (queue)
     WHERE EXISTS (SELECT FROM limited)
),
ready AS MATERIALIZED ({{ready_todos(room, $cap)}}),
due AS MATERIALIZED (
    SELECT candidate.id, wanted.queue, candidate.priority, candidate.concurrency_key,
           greatest(candidate.fair_at, candidate.next_retry_at) AS claimable_at
      FROM unnest((SELECT %(queues)s::text[])) AS wanted (queue)
      LEFT JOIN room ON room.queue = wanted.queue
     CROSS JOIN LATERAL (
            SELECT * FROM (
                SELECT id, priority, concurrency_key, next_retry_at, fair_at
                  FROM todos
                 WHERE state = 'pending' AND {{due_retry(wanted.queue)}}
                 ORDER BY next_retry_at
                 LIMIT $cap
                   FOR UPDATE SKIP LOCKED
            ) AS locked
            LIMIT least((SELECT %(limit)s::int), room.room)
           ) AS candidate
),
expired AS (SELECT * FROM ready WHERE false),
first_per_key AS MATERIALIZED ({{first_per_key(ready, due, expired)}}),
picked AS MATERIALIZED ({{picked(first_per_key, room)}}),
claimed AS (
    UPDATE todos
       SET {{leased_to_owner}}
     WHERE id = ANY (ARRAY(SELECT id FROM picked)) AND {{credential_holds}}
    RETURNING todos.*
)
{{claimed_in_order(claimed, picked, ready, limited)}};

-- name: claim_one
-- claim_next, lean, of one todo: claim_ready for a limit of 1, with the same scans, guards and
-- answer, in a plan of half as many nodes (a single claim's time in the database went more to
-- starting its plan's nodes than to running them). Of one candidate per queue from its ready
-- scans and one from its due scan, the first by priority, then claimable time, is taken: being
-- first of all, it is first of its concurrency key, which spares the numbering of candidates
-- per key (first_per_key), and the numbering per queue goes with the room, which a queue that
-- nothing limits does not have (picked). When a queue is paused or limited ("limited", read as
-- claim_ready reads it) no queue is scanned: it claims nothing, and says so. Its scans lock
-- under a cap of 1: the one row it may take (claim_next says why a small cap matters).
WITH limited AS MATERIALIZED (
    SELECT settings.name
    {{limiting((SELECT %(queues)s::text[])::text[])}}
),
candidate AS MATERIALIZED (
    SELECT ready.id, ready.priority, ready.fair_at AS claimable_at, true AS ready
      FROM unnest((SELECT %(queues)s::text[]), (SELECT %(marks)s::timestamptz[]),
                  (SELECT %(tops)s::int[]), (SELECT %(bottoms)s::int[]))
           AS wanted (queue, mark, top, bottom)
     CROSS JOIN LATERAL (SELECT * FROM ({{ready_scans(wanted, 1)}}) AS locked LIMIT 1) AS ready
     WHERE NOT EXISTS (SELECT FROM limited)
    UNION ALL
    SELECT due.id, due.priority, greatest(due.fair_at, due.next_retry_at), false
      FROM unnest((SELECT %(queues)s::text[])) AS wanted (queue)
     CROSS JOIN LATERAL (
            SELECT id, priority, next_retry_at, fair_at
              FROM todos
             WHERE state = 'pending' AND {{due_retry(wanted.queue)}}
             ORDER BY next_retry_at
             LIMIT 1
               FOR UPDATE SKIP LOCKED
           ) AS due
     WHERE NOT EXISTS (SELECT FROM limited)
),
picked AS MATERIALIZED (
    SELECT id, claimable_at, ready
      FROM candidate
     ORDER BY priority DESC, claimable_at
     LIMIT {{held_room(1)}}
),
claimed AS (
    UPDATE todos
       SET {{leased_to_owner}}
     WHERE id = (SELECT id FROM picked) AND {{credential_holds}}
    RETURNING todos.*
)
SELECT claimed.*, CASE WHEN picked.ready THEN picked.claimable_at END AS ready_turn
  FROM claimed CROSS JOIN picked
UNION ALL
SELECT (NULL::todos).*, NULL
 WHERE EXISTS (SELECT FROM limited);

-- name: claim_filtered
-- Claim the todos an ORM queryset picks (querysets.py). The three placeholders in braces are
-- its scans of ready todos, due retries and expired leases, each a SELECT of id, queue,
-- priority, concurrency_key and claimable_at, FOR UPDATE SKIP LOCKED, in claim order, carrying the
-- claimable, assignee and concurrency-key conditions; the update tests the first two again, so
-- that no queryset can make it claim what is not claimable. All candidates are then ranked by
-- priority and claimable time; of those sharing a key only the first is taken, and
-- idx_todos_key_claimed settles a race with another claim (managers/claiming.py).
WITH ready AS MATERIALIZED (
    {ready}
),
due AS MATERIALIZED (
    {due}
),
expired AS MATERIALIZED (
    {lapsed}
),
room AS MATERIALIZED ({{room(ARRAY(SELECT queue FROM ready UNION SELECT queue FROM due UNION SELECT queue FROM expired))}}),
first_per_key AS MATERIALIZED ({{first_per_key(ready, due, expired)}}),
picked AS MATERIALIZED ({{picked(first_per_key, room)}}),
free_slot AS MATERIALIZED ({{free_slot(room, (SELECT %(limit)s::int))}}),
slot AS MATERIALIZED (
    SELECT picked.id, free_slot.step, free_slot.slot
      FROM picked
      JOIN free_slot ON free_slot.queue = picked.queue AND free_slot.nth = picked.in_queue
),
taken_over AS MATERIALIZED ({{taken_over(SELECT id FROM picked WHERE id IN (SELECT id FROM expired))}}),
entry AS MATERIALIZED ({{error_entries(taken_over, owner, {{lease_expired}})}}),
trimmed AS ({{trimmed(entry)}}),
noted AS ({{noted(entry)}}),
claimed AS (
    UPDATE todos
       {{set_claimed(slot, entry, trimmed)}}
     WHERE id = ANY (ARRAY(SELECT id FROM picked))
       AND (state = 'pending' AND (next_retry_at IS NULL OR next_retry_at <= now())
            OR state = 'claimed' AND lease_expires_at <= now() AND attempt < max_attempts)
       AND (assignee IS NULL OR assignee = %(owner)s)
    RETURNING todos.*
),
counted AS ({{counted(claimed, slot, room)}})
SELECT * FROM claimed;

-- name: claim
-- Claim one todo by id: pending and due, or claimed with an expired lease and attempts left,
-- in a queue that is neither paused nor at a limit (the "room" CTE).
WITH room AS MATERIALIZED ({{room(ARRAY(SELECT queue FROM todos WHERE id = %(todo_id)s))}}),
picked AS (
    SELECT id, queue, 1 AS in_queue
      FROM todos
     WHERE id = %(todo_id)s
       AND coalesce((SELECT room.room FROM room WHERE room.queue = todos.queue), 1) > 0
),
free_slot AS MATERIALIZED ({{free_slot(room, 1)}}),
slot AS MATERIALIZED (
    SELECT picked.id, free_slot.step, free_slot.slot
      FROM picked
      JOIN free_slot ON free_slot.queue = picked.queue AND free_slot.nth = picked.in_queue
),
taken_over AS MATERIALIZED ({{taken_over(SELECT id FROM picked)}}),
entry AS MATERIALIZED ({{error_entries(taken_over, owner, {{lease_expired}})}}),
trimmed AS ({{trimmed(entry)}}),
noted AS ({{noted(entry)}}),
claimed AS (
    UPDATE todos
       {{set_claimed(slot, entry, trimmed)}}
     WHERE id = (SELECT id FROM picked)
       AND (assignee IS NULL OR assignee = %(owner)s)
       AND (state = 'pending' AND (next_retry_at IS NULL OR next_retry_at <= now())
            OR state = 'claimed' AND lease_expires_at <= now() AND attempt < max_attempts)
       AND {{key_free(todos)}}
    RETURNING todos.*
),
counted AS ({{counted(claimed, slot, room)}})
SELECT * FROM claimed;
