"""A handler's outcome is made storable: no return value or exception can stop a worker."""

from __future__ import annotations

import os
from typing import Any

import pytest

from switchboard_todos import outcomes, validation
from switchboard_todos.exceptions import InvalidTodo

BAD_NAME = os.fsdecode(b"report-\xff.csv")  # a lone surrogate, as a non-UTF-8 file name gives


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


class Unrepresentable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_storable_text_escapes_lone_surrogates_and_drops_nul() -> None:
    assert outcomes.storable_text(f"open {BAD_NAME}\x00") == "open report-\\udcff.csv"
    assert outcomes.storable_text("plain") == "plain"
    assert outcomes.storable_text("ünïcode 🙂") == "ünïcode 🙂"


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (OSError(f"cannot open {BAD_NAME}"), "cannot open report-\\udcff.csv"),
        (Unprintable("x"), "Unprintable('x')"),
        (Unrepresentable(), "<unprintable Unrepresentable>"),
    ],
)
def test_error_detail_is_always_storable(error: BaseException, message: str) -> None:
    """str() first, repr() when it raises, the type when both do; the detail passes validation."""
    try:
        raise error
    except BaseException as caught:
        detail = outcomes.error_detail(caught)
    assert detail["message"] == message
    validation.error(detail)  # raises InvalidTodo if PostgreSQL could not store it


def test_error_detail_trims_the_traceback_to_the_innermost_frames() -> None:
    """Deep recursion keeps the frames nearest the error, within the size limit."""

    def ping(depth: int) -> None:
        if depth == 0:
            raise RuntimeError("deep\x00down")
        pong(depth - 1)

    def pong(depth: int) -> None:
        ping(depth - 1)

    with pytest.raises(RuntimeError) as caught:
        ping(200)
    detail = outcomes.error_detail(caught.value)
    assert detail["type"] == "builtins.RuntimeError"
    assert detail["message"] == "deepdown"
    trace = detail["traceback"]
    assert trace.count(", in ping") + trace.count(", in pong") == 30
    assert trace.rstrip().endswith("RuntimeError: deepdown")


def test_fallback_error_has_a_fixed_shape() -> None:
    detail = outcomes.fallback_error(Unrepresentable(), ValueError(f"bad {BAD_NAME}"))
    assert detail["type"] == "tests.test_outcomes.Unrepresentable"
    assert "could not be stored (ValueError: bad report-\\udcff.csv)" in detail["message"]
    validation.error(detail)


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        (None, None),
        ({"ok": [1, 2.5, "x"]}, {"ok": [1, 2.5, "x"]}),
        ({"file": BAD_NAME}, {"file": "report-\\udcff.csv"}),
        (
            {BAD_NAME: ["a\x00b", (BAD_NAME,)]},
            {"report-\\udcff.csv": ["ab", ["report-\\udcff.csv"]]},
        ),
        (BAD_NAME, "report-\\udcff.csv"),
    ],
)
def test_results_are_made_storable(value: Any, stored: Any) -> None:
    assert outcomes.result(value) == stored


def test_an_oversize_result_is_replaced_by_a_note_and_its_head(settings: Any) -> None:
    settings.SWITCHBOARD_TODOS_MAX_JSON_BYTES = 10_000
    stored = outcomes.result({"rows": ["x" * 100] * 200})
    assert stored["note"].startswith("The handler returned 20")
    assert "the limit is 10000" in stored["note"]
    assert stored["head"].startswith('{"rows":["xxx')
    assert len(stored["head"]) == outcomes.HEAD_CHARS
    validation.result(stored)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"when": object()}, "is not JSON-serializable"),
        (float("nan"), "is not JSON-serializable"),
    ],
)
def test_a_result_that_is_not_json_fails_the_todo(value: Any, message: str) -> None:
    """Not JSON at all is the handler's bug: InvalidTodo, which the worker stores as the failure."""
    with pytest.raises(InvalidTodo, match=message):
        outcomes.result(value)


def test_a_result_nested_too_deep_fails_the_todo() -> None:
    deep: Any = "bottom"
    for _ in range(validation.MAX_JSON_DEPTH + 5):
        deep = [deep, BAD_NAME]
    with pytest.raises(InvalidTodo, match="nests arrays and objects"):
        outcomes.result(deep)
