"""Lanes: work taken in turns between owners, the oldest of each first."""

from __future__ import annotations

from switchboard_todos.lanes import Lanes


def test_owners_take_turns_and_each_owners_work_comes_in_order() -> None:
    lanes: Lanes[str] = Lanes()
    for work in ("a1", "a2", "a3"):
        lanes.put("a", work)
    lanes.put("b", "b1")
    taken = [lanes.take() for _ in range(3)]
    lanes.put("c", "c1")  # a newcomer goes behind those already in line
    taken += [lanes.take() for _ in range(2)]
    assert taken == ["a1", "b1", "a2", "a3", "c1"]
    assert not lanes and len(lanes) == 0  # an empty lane is dropped


def test_clear_gives_every_work_waiting_and_empties_the_lanes() -> None:
    lanes: Lanes[int] = Lanes()
    for owner, work in (("a", 1), ("b", 2), ("a", 3)):
        lanes.put(owner, work)
    assert sorted(lanes.clear()) == [1, 2, 3]
    assert not lanes
