"""The retry schedule: exponential, capped, with jitter. Pure functions, no Django."""

from __future__ import annotations

import random
from collections.abc import Callable

#: How many attempts the precomputed schedule covers; later attempts reuse the last entry.
SCHEDULE_LENGTH = 32


def retry_delay(
    attempt: int,
    *,
    base: float,
    cap: float,
    jitter: float,
    rand: Callable[[], float] = random.random,
) -> float:
    """Return the seconds to wait after failed attempt number `attempt` (1-based).

    The delay doubles per attempt from `base` and stops at `cap`; jitter then takes a random
    share of up to `jitter` (0 to 1) off it, so failures of a burst do not retry in step.
    With base=5, cap=3600 and no jitter: 5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560, 3600, …
    With jitter=0.5 each delay lands in [delay/2, delay].
    """
    if attempt < 1:
        raise ValueError(f"attempt must be 1 or more, not {attempt}.")
    exponent = min(attempt - 1, 62)  # 2**62 * base overflows nothing and is past any cap
    delay = min(cap, base * 2.0**exponent)
    return delay * (1.0 - jitter * rand())


def retry_schedule(
    *,
    base: float,
    cap: float,
    jitter: float,
    length: int = SCHEDULE_LENGTH,
    rand: Callable[[], float] = random.random,
) -> list[float]:
    """Return `retry_delay` for attempts 1..length, jittered independently."""
    return [
        retry_delay(attempt, base=base, cap=cap, jitter=jitter, rand=rand)
        for attempt in range(1, length + 1)
    ]
