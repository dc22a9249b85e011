-- The remote agents' statements (agents/service.py). Format as in todos.sql.

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
