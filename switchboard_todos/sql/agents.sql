-- The remote agents' statements (agents/service/). Format and conventions: shared.sql.

-- name: authenticate
-- The agent holding a token (by its hash), active or not; marks it seen at most once a
-- minute, so that a busy agent does not write its row on every request. The UPDATE runs
-- whether or not the final query reads it (a data-modifying WITH always does).
WITH found AS (
    SELECT * FROM todo_agents WHERE token_hash = %(token_hash)s
),
seen AS (
UPDATE todo_agents
   SET last_seen_at = now()
  FROM found
 WHERE todo_agents.id = found.id AND found.is_active
   AND (found.last_seen_at IS NULL OR found.last_seen_at < now() - interval '1 minute')
RETURNING todo_agents.id
)
SELECT * FROM found;

-- name: count_creates
-- Count %(count)s creations (one todo, or every todo of a plan) against agent %(agent_id)s's
-- quota of %(quota)s a minute, unless they would go past it. The agent's window is the minute
-- from its first creation after the last window ended. Returns whether they were counted, and
-- the seconds left in the window (how long a refused creation should wait). Creations of one
-- agent wait on its row in turn.
WITH agent AS (
    SELECT id,
           CASE WHEN creates_window > now() - interval '1 minute' THEN creates_window
                ELSE now() END AS window_start,
           CASE WHEN creates_window > now() - interval '1 minute' THEN creates_in_window
                ELSE 0 END AS created
      FROM todo_agents
     WHERE id = %(agent_id)s
       FOR NO KEY UPDATE
),
counted AS (
UPDATE todo_agents
   SET creates_window = agent.window_start,
       creates_in_window = agent.created + %(count)s
  FROM agent
 WHERE todo_agents.id = agent.id AND agent.created + %(count)s <= %(quota)s
RETURNING todo_agents.id
)
SELECT EXISTS (SELECT FROM counted) AS counted,
       extract(epoch FROM window_start + interval '1 minute' - now())::float8 AS window_left
  FROM agent;

-- name: held
-- How many todos %(owner)s holds (claimed, expired or not, until the reaper or another claim
-- takes them back), and the seconds until the earliest of their leases ends (idx_todos_held).
SELECT count(*) AS held,
       extract(epoch FROM min(lease_expires_at) - now())::float8 AS first_lease_ends_in
  FROM todos
 WHERE state = 'claimed' AND owner = %(owner)s;
