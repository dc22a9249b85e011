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
-- minute, unless either would go past its quota: then neither is counted. Each quota's window
-- is the minute from the agent's first write it counted after its last window ended (a write
-- that creates nothing leaves the creations' window alone). Returns whether they were counted,
-- whether the bytes fit, and the seconds until the last window of a quota they would pass ends
-- (how long a refused write should wait). The writes of one agent wait on its row in turn.
WITH agent AS (
    SELECT id,
           CASE WHEN creates_window > now() - interval '1 minute' THEN creates_window
                ELSE now() END AS creates_start,
           CASE WHEN creates_window > now() - interval '1 minute' THEN creates_in_window
                ELSE 0 END + %(count)s AS created,
           CASE WHEN bytes_window > now() - interval '1 minute' THEN bytes_window
                ELSE now() END AS bytes_start,
           CASE WHEN bytes_window > now() - interval '1 minute' THEN bytes_in_window
                ELSE 0 END + %(bytes)s AS written
      FROM todo_agents
     WHERE id = %(agent_id)s
       FOR NO KEY UPDATE
),
verdict AS (
    SELECT agent.*, %(count)s = 0 OR created <= %(quota)s AS creates_fit,
           written <= %(byte_quota)s AS bytes_fit
      FROM agent
),
counted AS (
UPDATE todo_agents
   SET creates_window = CASE WHEN %(count)s > 0 THEN verdict.creates_start
                             ELSE todo_agents.creates_window END,
       creates_in_window = verdict.created,
       bytes_window = verdict.bytes_start,
       bytes_in_window = verdict.written
  FROM verdict
 WHERE todo_agents.id = verdict.id AND verdict.creates_fit AND verdict.bytes_fit
RETURNING todo_agents.id
)
SELECT EXISTS (SELECT FROM counted) AS counted, bytes_fit,
       extract(epoch FROM greatest(CASE WHEN NOT creates_fit THEN creates_start END,
                                   CASE WHEN NOT bytes_fit THEN bytes_start END)
                          + interval '1 minute' - now())::float8 AS window_left
  FROM verdict;

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
