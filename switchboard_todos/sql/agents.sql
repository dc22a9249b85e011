-- The remote agents' statements (agents/service/). Format and conventions: shared.sql.

-- name: authenticate
-- The agent holding a token (by its hash), active or not; marks it seen at most once a
-- minute, so that a busy agent does not write its row on every request. The UPDATE runs
-- whether or not the final query reads it (a data-modifying WITH always does). The mark is
-- skipped while another session holds the row (the agent's own create counting its quota, an
-- operator's edit): waiting for it, every request of the agent arriving meanwhile held a
-- connection before its cap of requests in flight could count it. The next request marks it.
WITH found AS (
    SELECT * FROM todo_agents WHERE token_hash = %(token_hash)s
),
unseen AS (
    SELECT todo_agents.id
      FROM todo_agents
      JOIN found ON found.id = todo_agents.id
     WHERE found.is_active
       AND (found.last_seen_at IS NULL OR found.last_seen_at < now() - interval '1 minute')
       FOR NO KEY UPDATE OF todo_agents SKIP LOCKED
),
seen AS (
UPDATE todo_agents
   SET last_seen_at = now()
  FROM unseen
 WHERE todo_agents.id = unseen.id
RETURNING todo_agents.id
)
SELECT * FROM found;

-- fragment: creates_cost
-- What %(count)s creations cost of a quota of %(quota)s a minute: their share of the minute.
(%(count)s * 60.0 / greatest(%(quota)s, 1))::float8 * interval '1 second'

-- fragment: bytes_cost
-- What %(bytes)s bytes of JSON cost of a quota of %(byte_quota)s a minute.
(%(bytes)s * 60.0 / %(byte_quota)s)::float8 * interval '1 second'

-- fragment: fails_cost
-- What %(fails)s fails or releases cost of a quota of %(fail_quota)s a minute.
(%(fails)s * 60.0 / greatest(%(fail_quota)s, 1))::float8 * interval '1 second'

-- fragment: fit_at(paid_until, cost)
-- When a write costing `cost` fits a paced quota whose writes are paid for until `paid_until`
-- (NULL: nothing owed): once it would leave that at most %(burst)s seconds ahead of now() (the
-- burst), or, for a single write worth more than the burst, once nothing is owed.
greatest($paid_until, now()) + $cost - greatest(%(burst)s::float8 * interval '1 second', $cost)

-- name: count_writes
-- Count %(count)s creations (none, one todo, or every todo of a plan), %(bytes)s bytes of JSON
-- and %(fails)s fails or releases (none or one) against agent %(agent_id)s's quotas of
-- %(quota)s creations, %(byte_quota)s bytes and %(fail_quota)s fails a minute, paced (a GCRA):
-- each quota's column holds the time until which the agent's writes are paid for, at 60/quota
-- seconds a creation (a byte, a fail), so that the quota refills continuously at its rate; a
-- write fits when it leaves that time at most %(burst)s seconds ahead of now() (fit_at). Past
-- any quota none is counted; a quota the write adds nothing to does not stop it (a small error
-- while the agent owes bytes). Returns whether they were counted, the quota that refused them
-- (bytes first, NULL when the write lost the room to one that queued before it), and the
-- seconds until the write would fit (how long a refused write should wait; 0 when it lost).
-- The writes of one agent that fit wait on its row in turn; one its quotas refuse as this
-- statement's snapshot sees them (they only fill up meanwhile) is refused at once, with no
-- lock: a flood of an agent's writes past its quotas does not queue on its row.
WITH seen AS (
    SELECT id,
           CASE WHEN %(count)s > 0
                THEN {{fit_at(creates_paid_until, {{creates_cost}})}} END AS creates_fit_at,
           CASE WHEN %(bytes)s > 0
                THEN {{fit_at(bytes_paid_until, {{bytes_cost}})}} END AS bytes_fit_at,
           CASE WHEN %(fails)s > 0
                THEN {{fit_at(fails_paid_until, {{fails_cost}})}} END AS fails_fit_at
      FROM todo_agents
     WHERE id = %(agent_id)s
),
agent AS (
    -- Locked only where the snapshot's row has room; once locked, the room is tested again
    -- on the row's latest version (READ COMMITTED's recheck), which a write that queued
    -- before may have taken: then no row.
    SELECT id,
           greatest(creates_paid_until, now()) + {{creates_cost}} AS creates_paid,
           greatest(bytes_paid_until, now()) + {{bytes_cost}} AS bytes_paid,
           greatest(fails_paid_until, now()) + {{fails_cost}} AS fails_paid
      FROM todo_agents
     WHERE id = %(agent_id)s
       AND (%(count)s = 0 OR {{fit_at(creates_paid_until, {{creates_cost}})}} <= now())
       AND (%(bytes)s = 0 OR {{fit_at(bytes_paid_until, {{bytes_cost}})}} <= now())
       AND (%(fails)s = 0 OR {{fit_at(fails_paid_until, {{fails_cost}})}} <= now())
       FOR NO KEY UPDATE
),
counted AS (
UPDATE todo_agents
   SET creates_paid_until = agent.creates_paid,
       bytes_paid_until = agent.bytes_paid,
       fails_paid_until = agent.fails_paid
  FROM agent
 WHERE todo_agents.id = agent.id
RETURNING todo_agents.id
)
SELECT EXISTS (SELECT FROM counted) AS counted,
       CASE WHEN bytes_fit_at > now() THEN 'bytes'
            WHEN creates_fit_at > now() THEN 'creations'
            WHEN fails_fit_at > now() THEN 'fails' END AS refused_by,
       coalesce(extract(epoch FROM greatest(
           CASE WHEN creates_fit_at > now() THEN creates_fit_at END,
           CASE WHEN bytes_fit_at > now() THEN bytes_fit_at END,
           CASE WHEN fails_fit_at > now() THEN fails_fit_at END) - now())::float8, 0) AS wait
  FROM seen;

-- name: paced_room
-- What agent %(agent_id)s may write at once now, by the database's clock (the admin's agent
-- page): the creations, bytes of JSON and fails or releases its paced quotas (count_writes)
-- have room for.
SELECT {{paced_writes(creates_paid_until, %(quota)s)}} AS creations,
       {{paced_writes(bytes_paid_until, %(byte_quota)s)}} AS bytes,
       {{paced_writes(fails_paid_until, %(fail_quota)s)}} AS fails
  FROM todo_agents
 WHERE id = %(agent_id)s;

-- fragment: paced_writes(paid_until, quota)
-- How many writes, of a paced quota of `quota` a minute whose writes are paid for until
-- `paid_until`, fit at once now: the burst's worth (at least one write's) less what is owed.
floor(greatest(0, greatest(%(burst)s::float8, 60.0 / $quota)
                  - extract(epoch FROM greatest($paid_until - now(), interval '0')))
      * $quota / 60.0)::bigint

-- name: held
-- How many todos %(owner)s holds (claimed, expired or not, until the reaper or another claim
-- takes them back), and the seconds until the earliest of their leases ends (idx_todos_held).
SELECT count(*) AS held,
       extract(epoch FROM min(lease_expires_at) - now())::float8 AS first_lease_ends_in
  FROM todos
 WHERE state = 'claimed' AND owner = %(owner)s;

-- name: check_credential
-- Whether agent %(name)s is still active under the credentials it was recognised by: the salt
-- %(credential)s, which every rotation and revocation replaces (agents/accounts.py).
SELECT EXISTS (
    SELECT FROM todo_agents
     WHERE name = %(name)s AND is_active AND credential_salt = %(credential)s
);

-- name: create_task
-- An MCP task (agents/service/tasks.py) of agent %(agent)s for todo %(todo_id)s, which its
-- call of tool %(tool)s made (%(created)s: created, not found by its key), kept %(ttl_ms)s milliseconds from now (the
-- database's clock, as every time of its todo); the id is the caller's random one.
INSERT INTO todo_tasks (id, agent, todo_id, tool, created, keep_until)
VALUES (%(id)s, %(agent)s, %(todo_id)s, %(tool)s, %(created)s,
        now() + %(ttl_ms)s * interval '1 millisecond')
RETURNING id, agent, todo_id, tool, created, created_at, keep_until;
