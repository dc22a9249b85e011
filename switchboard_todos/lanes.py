"""Work waiting by whose it is, taken in turns: the threads of the agents' API
(agents/fair_threads.py) and of the long polls' claims (claims/long_polls.py) serve their
agents this way, so that one agent's many requests wait behind the others' next one, not in
front of it."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Lanes(Generic[T]):
    """A queue per owner; `take` gives the oldest work of the owner served least recently.

    Not locked: its users hold their own lock around it. A lane is dropped once empty, so the
    lanes are bounded by the work waiting, whatever owners a client makes up.
    """

    def __init__(self) -> None:
        #: Each owner's waiting work, in the order the owners are next served.
        self._lanes: dict[str, deque[T]] = {}

    def __bool__(self) -> bool:
        return bool(self._lanes)

    def __len__(self) -> int:
        """How many owners have work waiting."""
        return len(self._lanes)

    def put(self, owner: str, work: T) -> None:
        self._lanes.setdefault(owner, deque()).append(work)

    def take(self) -> T:
        """The oldest work of the owner first in line, who goes to the back of the line."""
        owner = next(iter(self._lanes))
        works = self._lanes.pop(owner)
        work = works.popleft()
        if works:
            self._lanes[owner] = works
        return work

    def clear(self) -> Iterator[T]:
        """Every work waiting, the lanes emptied."""
        lanes, self._lanes = self._lanes, {}
        for works in lanes.values():
            yield from works
