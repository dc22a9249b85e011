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

-- name: count_writes
-- Count %(count)s creations (none, one todo, or every todo of a plan) and %(bytes)s bytes of
-- JSON against agent %(agent_id)s's quotas of %(quota)s creations and %(byte_quota)s bytes a
-- minute, paced (GCRA): each quota's column holds the time until which its past writes are
-- paid for, at 60/quota seconds a creation (a byte), so that it refills continuously at the
-- quota a minute; a write fits when it leaves that time at most %(burst)s seconds ahead of
-- now() (its burst: that many seconds' worth of the quota at once), or, for a single write
-- worth more than the burst, when nothing is owed. Past either quota neither is counted.
-- Returns whether they were counted, whether the bytes fit, and the seconds until the write
-- would fit (how long a refused write should wait). The writes of one agent wait on its row
-- in turn.
WITH agent AS (
    SELECT id,
           greatest(creates_paid_until, now()) AS creates_from,
           %(count)s * 60.0 / greatest(%(quota)s, 1) * interval '1 second' AS creates_cost,
           greatest(bytes_paid_until, now()) AS bytes_from,
           %(bytes)s * 60.0 / %(byte_quota)s * interval '1 second' AS bytes_cost
      FROM todo_agents
     WHERE id = %(agent_id)s
       FOR NO KEY UPDATE
),
verdict AS (
    SELECT agent.*,
           creates_from + creates_cost
             - greatest(%(burst)s::float8 * interval '1 second', creates_cost) AS creates_fit_at,
           bytes_from + bytes_cost
             - greatest(%(burst)s::float8 * interval '1 second', bytes_cost) AS bytes_fit_at
      FROM agent
),
fit AS (
    SELECT verdict.*, %(count)s = 0 OR creates_fit_at <= now() AS creates_fit,
           bytes_fit_at <= now() AS bytes_fit
      FROM verdict
),
counted AS (
UPDATE todo_agents
   SET creates_paid_until = fit.creates_from + fit.creates_cost,
       bytes_paid_until = fit.bytes_from + fit.bytes_cost
  FROM fit
 WHERE todo_agents.id = fit.id AND fit.creates_fit AND fit.bytes_fit
RETURNING todo_agents.id
)
SELECT EXISTS (SELECT FROM counted) AS counted, bytes_fit,
       extract(epoch FROM greatest(CASE WHEN NOT creates_fit THEN creates_fit_at END,
                                   CASE WHEN NOT bytes_fit THEN bytes_fit_at END)
                          - now())::float8 AS wait
  FROM fit;

-- name: paced_room
-- What agent %(agent_id)s may write at once now, by the database's clock (the admin's agent
-- page): the creations and bytes of JSON its paced quotas (count_writes) have room for.
SELECT floor(greatest(0, greatest(%(burst)s::float8, 60.0 / %(quota)s)
                         - extract(epoch FROM greatest(creates_paid_until - now(), interval '0')))
             * %(quota)s / 60.0)::bigint AS creations,
       floor(greatest(0, %(burst)s::float8
                         - extract(epoch FROM greatest(bytes_paid_until - now(), interval '0')))
             * %(byte_quota)s / 60.0)::bigint AS bytes
  FROM todo_agents
 WHERE id = %(agent_id)s;

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
