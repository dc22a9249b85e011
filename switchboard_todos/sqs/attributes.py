"""A queue's attributes as SQS's GetQueueAttributes answers them.

The counts are the queue health the admin and the metrics read, by the database's clock. The
settings come from the queue's row (`Queue`, in the database the queue lives in): its
visibility timeout is the lease of every ReceiveMessage that gives none, so the value clients
read is the one their receives get. kombu (Celery) never gives one, and reads the redrive
policy to decide whether a rejected message is left for the dead letters.
"""

from __future__ import annotations

import json
from datetime import timedelta

from switchboard_todos import placement, stats
from switchboard_todos.conf import conf
from switchboard_todos.models import Queue
from switchboard_todos.transitions import DEFAULT_MAX_ATTEMPTS


def of(queue: str) -> dict[str, str]:
    """Every attribute of `queue` this endpoint has, by SQS's names (strings, as SQS's)."""
    alias = placement.database_for(queue)
    # Nothing of the finished todos (recent=0), which SQS does not count.
    found = stats.queue_health([queue], recent=timedelta(0), using=alias)
    health = found[0] if found else None
    row = Queue.objects.using(alias).filter(name=queue).first()
    visibility = row.visibility_timeout if row is not None else None
    seconds = visibility.total_seconds() if visibility is not None else conf.DEFAULT_TTL
    receives = row.max_attempts if row is not None and row.max_attempts else DEFAULT_MAX_ATTEMPTS
    return {
        "ApproximateNumberOfMessages": str(health.ready if health else 0),
        "ApproximateNumberOfMessagesNotVisible": str(
            health.claimed + health.lease_expired if health else 0
        ),
        "ApproximateNumberOfMessagesDelayed": str(health.scheduled if health else 0),
        # Whole seconds, as SQS's; a lease of a fraction of a second shows as 1.
        "VisibilityTimeout": str(max(round(seconds), 1)),
        "RedrivePolicy": json.dumps({"maxReceiveCount": receives, "deadLetterTargetArn": "failed"}),
    }
