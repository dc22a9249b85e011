"""The validators of the names the models hold, an agent's and a queue's (the admin's forms
run them)."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator

from switchboard_todos import validation
from switchboard_todos.exceptions import InvalidTodo

#: An agent's name is the `owner` of every todo it claims: a one-word name, as a queue's.
AGENT_NAME_MAX_LENGTH = 100
agent_name_validator = RegexValidator(
    rf"\A[A-Za-z0-9][A-Za-z0-9_.:-]{{0,{AGENT_NAME_MAX_LENGTH - 1}}}\Z",
    "Use up to 100 letters, digits and _ . : -, starting with a letter or digit.",
)


def validate_queue_name(name: str) -> None:
    """A valid queue name (for the admin's forms)."""
    try:
        validation.queue(name)
    except InvalidTodo as error:
        raise ValidationError(str(error)) from None


def validate_queue_names(names: list[str]) -> None:
    """Each of an agent's granted queues is a valid queue name (for the admin's form)."""
    for name in names:
        validate_queue_name(name)
