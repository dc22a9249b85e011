"""Who holds back vacuum of the todos table, and how many dead rows it carries meanwhile; and
the planner's picture of the table, kept from falling far behind it (`analyze_if_outgrown`).

Every transition leaves a dead row version behind; vacuum may remove it only once no snapshot can
still see it. One old snapshot (a `REPEATABLE READ` report, a session idle in a transaction, a
forgotten prepared transaction, a replication slot) holds back this "xmin horizon" for the whole
database: dead rows pile up, the partial indexes swell, and every claim steps over them. These
reads name the holder, so an operator can see who does it, long before users notice.

Other roles' sessions are visible only to a role with `pg_read_all_stats` (or `pg_monitor`); see
docs/operating.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import connections, router

from switchboard_todos.conf import conf
from switchboard_todos.models import Todo
from switchboard_todos.stats import format_age

# Each kind of holder with its age in transaction ids (what vacuum goes by) and, where PostgreSQL
# keeps one, in time. A session holds the horizon with its snapshot (backend_xmin) or with its
# own transaction id once it wrote (backend_xid), whichever is older. Sessions of other databases
# do not hold back this one's tables; walsenders (no database) do, with hot_standby_feedback.
# Autovacuum workers are left out: vacuums ignore each other's snapshots. A replication slot
# holds user tables with its xmin (a physical slot's standby feedback); catalog_xmin holds only
# the catalogs. Ages are taken at the statement's time, not the transaction's: this read may
# itself run inside a long transaction, whose own session is left out.
_HORIZON = """
WITH holders (kind, pid, application, state, started, xids) AS (
    SELECT 'session', pid, application_name, state, xact_start,
           greatest(age(backend_xmin), age(backend_xid))
      FROM pg_stat_activity
     WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
       AND pid <> pg_backend_pid()
       AND backend_type <> 'autovacuum worker'
       AND (datname = current_database() OR datname IS NULL)
    UNION ALL
    SELECT 'prepared transaction', NULL, gid, 'prepared', prepared, age(transaction)
      FROM pg_prepared_xacts
     WHERE database = current_database()
    UNION ALL
    SELECT 'replication slot', active_pid, slot_name,
           CASE WHEN active THEN 'active' ELSE 'inactive' END, NULL, age(xmin)
      FROM pg_replication_slots
     WHERE xmin IS NOT NULL
)
SELECT statement_timestamp(), kind, pid, application, state,
       statement_timestamp() - started, xids
  FROM (SELECT 1) AS always
  LEFT JOIN LATERAL (SELECT * FROM holders ORDER BY xids DESC, started LIMIT 1) AS oldest ON true
"""

# The table's size in pages now and at its last VACUUM or ANALYZE (what the planner last
# measured), and whether this role may analyze it: a member of its owner's role, or a superuser.
_SIZES = """
SELECT pg_relation_size(oid) / current_setting('block_size')::int, relpages,
       pg_has_role(relowner, 'USAGE')
  FROM pg_class
 WHERE oid = %s::regclass
"""

#: How far todos may outgrow the size the planner last measured before the reaper analyzes it
#: (analyze_if_outgrown): this many times that size, and at least OUTGROWN_PAGES (512 KB).
OUTGROWN_FACTOR = 8
OUTGROWN_PAGES = 64

# The table's row counts as the statistics collector last saw them: no read of the table.
_TUPLES = """
SELECT n_live_tup, n_dead_tup, statement_timestamp() - greatest(last_vacuum, last_autovacuum)
  FROM pg_stat_user_tables
 WHERE relid = %s::regclass
"""


@dataclass(frozen=True)
class HorizonHolder:
    """The session, prepared transaction or replication slot with the oldest snapshot."""

    kind: str
    """"session", "prepared transaction" or "replication slot"."""
    pid: int | None
    """The backend's process id (a slot's when it is in use); None for a prepared transaction."""
    application: str
    """A session's application_name, a prepared transaction's gid, a slot's name."""
    state: str
    """A session's state ("idle in transaction", "active", ...), "prepared", or a slot's."""
    age: timedelta | None
    """How long its transaction has been open; None for a slot (PostgreSQL keeps no time)."""
    xids: int
    """How many transaction ids old its snapshot is: what vacuum's cutoff lags by."""

    @property
    def age_text(self) -> str:
        """The age for people: "5 min 3 s"; "" for a slot."""
        return "" if self.age is None else format_age(self.age)


@dataclass(frozen=True)
class VacuumHealth:
    """The xmin horizon's holder and the todos table's dead rows, with the warnings they earn."""

    at: datetime
    """The database's clock when this was read."""
    holder: HorizonHolder | None
    """None when nothing else holds a snapshot."""
    live_tuples: int
    dead_tuples: int
    """Dead row versions waiting for vacuum, as last counted by the statistics collector."""
    since_vacuum: timedelta | None
    """Time since the table was last vacuumed (by hand or autovacuum); None if never."""

    @property
    def since_vacuum_text(self) -> str:
        return "" if self.since_vacuum is None else format_age(self.since_vacuum)

    @property
    def warnings(self) -> list[str]:
        """What an operator should look at, by the SWITCHBOARD_TODOS_*_WARNING thresholds."""
        found = []
        holder, limit = self.holder, conf.HORIZON_WARNING_AGE
        if holder is not None and holder.age is not None and holder.age.total_seconds() > limit:
            who = f"pid {holder.pid}" if holder.pid is not None else holder.application
            found.append(
                f"A {holder.kind} ({who}, {holder.application or 'no application name'}, "
                f"{holder.state}) has held back vacuum for {holder.age_text}: the todos "
                "table keeps every dead row until it ends."
            )
        if self.dead_tuples > conf.DEAD_TUPLES_WARNING:
            found.append(
                f"The todos table holds {self.dead_tuples:,} dead rows (warning past "
                f"{conf.DEAD_TUPLES_WARNING:,}): claims step over them until vacuum can run."
            )
        return found

    def as_json(self) -> dict[str, Any]:
        """For monitoring: ages in seconds."""
        holder = self.holder
        return {
            "xmin_horizon": None
            if holder is None
            else {
                "kind": holder.kind,
                "pid": holder.pid,
                "application": holder.application,
                "state": holder.state,
                "age": _seconds(holder.age),
                "xids": holder.xids,
            },
            "live_tuples": self.live_tuples,
            "dead_tuples": self.dead_tuples,
            "since_vacuum": _seconds(self.since_vacuum),
            "warnings": self.warnings,
        }


def vacuum_health(using: str | None = None) -> VacuumHealth:
    """Read the horizon's holder and the table's dead rows of database `using` (the router's
    by default): two reads of catalog views."""
    with connections[using or router.db_for_read(Todo)].cursor() as cursor:
        cursor.execute(_HORIZON)
        at, kind, *found = cursor.fetchone()
        cursor.execute(_TUPLES, [Todo._meta.db_table])
        live, dead, since_vacuum = cursor.fetchone() or (0, 0, None)
    holder = None if kind is None else HorizonHolder(kind, *found)
    return VacuumHealth(at, holder, live, dead, since_vacuum)


def _seconds(age: timedelta | None) -> float | None:
    return None if age is None else round(age.total_seconds(), 3)


class Outgrown(NamedTuple):
    """What `analyze_if_outgrown` found: todos' size in pages when last measured, and now."""

    measured: int
    now: int


def analyze_if_outgrown(using: str) -> Outgrown | None:
    """ANALYZE todos of database `using` once it has outgrown the size the planner last
    measured (OUTGROWN_FACTOR times, at least OUTGROWN_PAGES); say so, else return None.

    The todo statements run prepared, on one generic plan per connection (cursors.py), made
    from the table's size at their first call and kept until a VACUUM or ANALYZE of todos
    invalidates it. Plans made while the table was empty read all of it at every call once
    work arrives: a worker claimed and completed at 17.7 ms a todo over 100,000 pending ones,
    0.08 ms once the table was analyzed (docs/operating.md). Autovacuum analyzes the table
    long before it grows eightfold; where it is off or behind, the reaper's sweep does, and
    every connection plans its statements again at its next call. A role that may not analyze
    the table, or a table another session is vacuuming (SKIP_LOCKED), is left as it is.
    """
    table = Todo._meta.db_table
    with connections[using].cursor() as cursor:
        cursor.execute(_SIZES, [table])
        now, measured, may = cursor.fetchone()
        if not may or now < max(OUTGROWN_PAGES, OUTGROWN_FACTOR * measured):
            return None
        cursor.execute(f"ANALYZE (SKIP_LOCKED) {connections[using].ops.quote_name(table)}")
    return Outgrown(measured, now)
