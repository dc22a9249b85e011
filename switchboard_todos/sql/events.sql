-- The statements of Event.objects (events.py). Format and conventions: shared.sql.

-- name: record_event
-- Insert an event unless its (source, delivery_id) is stored already (idx_events_delivery): a
-- copy arriving while the first one's transaction is open waits for it, then inserts nothing.
INSERT INTO events (source, kind, payload, delivery_id)
VALUES (%(source)s, %(kind)s, %(payload)s::jsonb, %(delivery_id)s)
ON CONFLICT (source, delivery_id) WHERE delivery_id IS NOT NULL DO NOTHING
RETURNING *;
