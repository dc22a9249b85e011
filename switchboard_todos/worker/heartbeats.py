"""Heartbeats: the leases of the running todos extended, their handlers' progress notes stored,
and the todos an operator cancelled learned of: one statement per database and beat."""

from __future__ import annotations

import time
from functools import partial

from switchboard_todos import faults
from switchboard_todos.worker.databases import Databases
from switchboard_todos.worker.hand import Hand, Held, database_of, logger


class Heartbeater:
    """Extends the lease of each running todo when a third of the TTL has passed since it was
    last set, with its handler's latest progress note. A heartbeat that finds the lease gone
    marks the todo lost: its outcome is then not stored, as another worker owns it now. One
    that finds it cancelled by an operator tells the handler (`todo_cancelled()`), and the
    watchdog stops waiting for it.
    """

    def __init__(self, hand: Hand, databases: Databases) -> None:
        self.hand = hand
        self.databases = databases
        self.every = hand.ttl / 3

    def beat(self) -> None:
        """One `heartbeat_many` per database for the todos due a beat.

        The statement skips a todo whose row another session holds locked, so one locked row
        costs no other lease; the skipped todo is due again at the next beat.
        """
        now = time.monotonic()
        due = {
            todo_id: held
            for todo_id, held in list(self.hand.running.items())
            if not held.lost
            and not held.released
            and not held.running.cancelled
            and now - held.leased_at >= self.every
        }
        by_database: dict[str, dict[str, Held]] = {}
        for todo_id, held in due.items():
            by_database.setdefault(database_of(held.todo), {})[todo_id] = held
        for alias, database_due in by_database.items():
            self._beat_database(alias, database_due, now)

    def _beat_database(self, alias: str, due: dict[str, Held], now: float) -> None:
        """One `heartbeat_many` for the todos of database `alias` due a beat."""
        hand = self.hand
        progress = {
            todo_id: held.running.progress
            for todo_id, held in due.items()
            if held.running.progress is not None
        }
        try:
            beats = self.databases.run(
                "heartbeat",
                partial(self.databases.managers[alias].heartbeat_many, progress=progress),
                hand.owner,
                hand.ttl,
                list(due),
                tries=1,
                database=alias,
            )
        except faults.DatabaseUnavailable:
            return  # the next beat tries again
        for todo_id in beats.extended:
            due[todo_id].leased_at = now
        for todo_id in beats.lost:
            due[todo_id].lost = True
            logger.warning("todo %s: lease lost to another worker", todo_id)
        for todo_id in beats.cancelled:
            due[todo_id].running.cancelled = True
        if skipped := len(due) - len(beats.extended) - len(beats.lost) - len(beats.cancelled):
            logger.info(
                "worker %s: %d todos locked by another session; their leases are "
                "extended at the next beat",
                hand.owner,
                skipped,
            )
