"""The doorbell and the listener: rings are not lost, a dropped connection comes back."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from switchboard_todos.claims.listen import Doorbell, Listener
from switchboard_todos.models import Todo


def test_a_ring_before_the_wait_is_kept() -> None:
    """Work notified while nobody waited wakes the next waiter at once, up to the capacity."""
    doorbell = Doorbell(["q"], capacity=2)
    doorbell.ring(5)
    assert doorbell.wait(0) and doorbell.wait(0)
    assert not doorbell.wait(0)


def test_a_ring_wakes_a_blocked_thread() -> None:
    """A thread blocked in wait() returns True as soon as another thread rings."""
    doorbell = Doorbell(["q"])
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(doorbell.wait(30)))
    waiter.start()
    time.sleep(0.05)
    doorbell.ring()
    waiter.join(5)
    assert woke == [True]


def listener_backends() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
        )
        return [pid for (pid,) in cursor.fetchall()]


@pytest.mark.django_db(transaction=True)
def test_the_listener_reconnects_and_catches_up() -> None:
    """Its backend terminated, the listener reconnects, rings everyone, and hears new work."""
    listener = Listener()
    doorbell = Doorbell(["default"])
    try:
        assert listener.subscribe(doorbell)
        (pid,) = listener_backends()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        assert doorbell.wait(30), "no catch-up ring after the reconnect"
        deadline = time.monotonic() + 30
        while not listener.listening or listener_backends() == [pid]:
            assert time.monotonic() < deadline, "the listener did not reconnect"
            time.sleep(0.05)
        Todo.objects.create_todo(kind="k")
        assert doorbell.wait(30), "no ring for work enqueued after the reconnect"
    finally:
        listener.stop()
    assert listener_backends() == []
    assert not listener.listening
