"""The retry schedule, without a database."""

from __future__ import annotations

import pytest

from switchboard_todos.backoff import SCHEDULE_LENGTH, retry_delay, retry_schedule


def test_delays_double_from_the_base_up_to_the_cap() -> None:
    """Without jitter: base, 2×base, 4×base, … and never past the cap."""
    delays = [retry_delay(n, base=5, cap=3600, jitter=0) for n in range(1, 14)]
    assert delays == [5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560, 3600, 3600, 3600]


def test_huge_attempt_numbers_stay_at_the_cap() -> None:
    """No overflow however many attempts a todo has had."""
    assert retry_delay(10_000, base=5, cap=60, jitter=0) == 60


@pytest.mark.parametrize("draw", [0.0, 0.25, 0.999999])
def test_jitter_takes_at_most_its_share_off(draw: float) -> None:
    """With jitter j, a delay d lands in [d × (1 − j), d]."""
    delay = retry_delay(3, base=10, cap=3600, jitter=0.5, rand=lambda: draw)
    assert 20 <= delay <= 40
    assert delay == pytest.approx(40 * (1 - 0.5 * draw))


def test_full_jitter_can_reach_zero_but_never_below() -> None:
    """jitter=1 spreads the delay over [0, d]."""
    assert retry_delay(1, base=8, cap=60, jitter=1, rand=lambda: 1.0) == 0


def test_attempts_start_at_one() -> None:
    """Attempt 0 is a caller bug, not a zero delay."""
    with pytest.raises(ValueError, match="attempt must be 1 or more"):
        retry_delay(0, base=1, cap=1, jitter=0)


def test_schedule_covers_each_attempt_with_independent_jitter() -> None:
    """One entry per attempt, each jittered by its own draw."""
    draws = iter([0.0, 1.0] * SCHEDULE_LENGTH)
    schedule = retry_schedule(base=1, cap=1000, jitter=0.5, rand=lambda: next(draws))
    assert len(schedule) == SCHEDULE_LENGTH
    assert schedule[:4] == [1, 1, 4, 4]
