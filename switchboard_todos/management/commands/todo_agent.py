"""`manage.py todo_agent`: create remote agents, rotate or revoke their tokens, list them."""

from __future__ import annotations

from argparse import SUPPRESS, ArgumentParser
from collections.abc import Callable
from typing import Any

from django.core.management.base import CommandError

from switchboard_todos.agents import accounts
from switchboard_todos.conf import conf
from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.management.base import OperatorCommand
from switchboard_todos.management.cli import positive_int, queue_name
from switchboard_todos.models import Agent


class Command(OperatorCommand):
    help = (
        "Manage the remote agents that work the queues over HTTP or MCP. `create` and `rotate` "
        "print the new token alone on the last line: it is shown only this once (only its hash "
        "is stored). `revoke` refuses the agent's token from now on; `rotate` gives a new one "
        "and makes a revoked agent active again. `sqs-credentials` prints the agent's SQS "
        "access key and secret as two shell lines (docs/sqs.md); rotating the token rotates them. "
        "`limits` sets the agent's quotas (`default`: the SWITCHBOARD_TODOS_AGENT_* setting), "
        "or shows them."
    )

    examples = [
        "manage.py todo_agent create triage-bot --queue github --queue mail",
        "manage.py todo_agent create planner --queue plans --create-queue github",
        "manage.py todo_agent rotate triage-bot",
        "manage.py todo_agent revoke triage-bot",
        "manage.py todo_agent list",
        "manage.py todo_agent sqs-credentials triage-bot",
        "manage.py todo_agent create importer --create-queue github --max-creates-per-minute 60",
        "manage.py todo_agent limits triage-bot --max-held 10 --max-attempts default",
        "manage.py todo_agent limits importer --max-bytes-per-minute 4194304",
    ]

    def add_arguments(self, parser: ArgumentParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        create = actions.add_parser("create", help="Create an agent and print its token.")
        create.add_argument("name", help="The agent's name: the owner of what it claims.")
        for flag, dest, what in (
            ("--queue", "claim_queues", "claim from"),
            ("--create-queue", "create_queues", "create todos in"),
        ):
            create.add_argument(
                flag,
                action="append",
                type=queue_name,
                dest=dest,
                default=[],
                metavar="QUEUE",
                help=f"A queue it may {what}; repeat for several.",
            )
        _quota_options(create, positive_int)
        limits = actions.add_parser("limits", help="Set or show the quotas of an agent.")
        limits.add_argument("name")
        _quota_options(limits, _quota)
        for action, what in (
            ("rotate", "Print a new token"),
            ("revoke", "Revoke the token"),
            ("sqs-credentials", "Print the SQS credentials"),
        ):
            actions.add_parser(action, help=f"{what} of an agent.").add_argument("name")
        actions.add_parser("list", help="List the agents.")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "list":
            self._list()
            return
        if action == "create":
            try:
                agent, token = accounts.create_agent(
                    options["name"],
                    claim_queues=options["claim_queues"],
                    create_queues=options["create_queues"],
                )
            except InvalidTodo as error:
                raise CommandError(str(error)) from None
            _set_quotas(agent, options)
            self._show_token(
                f"Created agent {agent.name!r}: {_grants(agent)}; {_quotas(agent)}.", token
            )
            return
        agent = self._agent(options["name"])
        if action == "limits":
            _set_quotas(agent, options)
            self.stdout.write(f"Agent {agent.name!r}: {_quotas(agent)}.")
            return
        if action == "sqs-credentials":
            from switchboard_todos.sqs.signing import secret_for

            self.stdout.write(f"AWS_ACCESS_KEY_ID={agent.name}")
            self.stdout.write(f"AWS_SECRET_ACCESS_KEY={secret_for(agent)}")
            return
        if action == "rotate":
            token = accounts.rotate_token(agent)
            self._show_token(
                f"New token of agent {agent.name!r}; the old one no longer works.", token
            )
        else:
            accounts.revoke(agent)
            self.stdout.write(f"Revoked the token of agent {agent.name!r}.")

    def _agent(self, name: str) -> Agent:
        try:
            return Agent.objects.get(name=name)
        except Agent.DoesNotExist:
            raise CommandError(f"No agent is named {name!r} (see: todo_agent list).") from None

    def _show_token(self, message: str, token: str) -> None:
        self.stdout.write(message)
        self.stdout.write("Its token, shown this once only (store it as a secret):")
        self.stdout.write(token)

    def _list(self) -> None:
        for agent in Agent.objects.all():
            status = "active" if agent.is_active else "revoked"
            seen = (
                agent.last_seen_at.isoformat(timespec="seconds") if agent.last_seen_at else "never"
            )
            self.stdout.write(
                f"{agent.name}\t{status}\t{agent.token_prefix}…\tlast seen {seen}\t"
                f"{_grants(agent)}\t{_quotas(agent)}"
            )


def _grants(agent: Agent) -> str:
    claims = ", ".join(agent.claim_queues) or "no queue"
    creates = ", ".join(agent.create_queues) or "no queue"
    return f"claims from {claims}; creates in {creates}"


#: The quota options: the Agent field each sets, the setting that applies when it is empty, and
#: what it limits.
QUOTAS = {
    "--max-held": ("max_held", "AGENT_MAX_HELD", "todos it may hold at once"),
    "--max-creates-per-minute": (
        "max_creates_per_minute",
        "AGENT_MAX_CREATES_PER_MINUTE",
        "todos it may create per minute",
    ),
    "--max-attempts": (
        "max_attempts_limit",
        "AGENT_MAX_ATTEMPTS",
        "the highest max_attempts it may give",
    ),
    "--max-bytes-per-minute": (
        "max_bytes_per_minute",
        "AGENT_MAX_BYTES_PER_MINUTE",
        "bytes of JSON it may write per minute",
    ),
}
DEFAULT = "default"
#: Quotas shown only where the agent has its own: the line of every agent would otherwise end in
#: the same long number of bytes.
SHOWN_WHEN_SET = {"max_bytes_per_minute"}


def _quota_options(parser: ArgumentParser, kind: Callable[[str], int | None]) -> None:
    for flag, (field, setting, what) in QUOTAS.items():
        parser.add_argument(
            flag,
            dest=field,
            type=kind,
            default=SUPPRESS,  # left out: unchanged
            metavar="N",
            help=f"Most {what}; default: SWITCHBOARD_TODOS_{setting}.",
        )


def _quota(text: str) -> int | None:
    """A quota of 1 or more, or `default` (None: the setting)."""
    return None if text == DEFAULT else positive_int(text)


def _set_quotas(agent: Agent, options: dict[str, Any]) -> None:
    """Set the quotas given as options; None (`limits --max-held default`) is the setting."""
    given = {
        field: options[field] for field, _setting, _what in QUOTAS.values() if field in options
    }
    if given:
        Agent.objects.filter(pk=agent.pk).update(**given)
        agent.refresh_from_db()


def _quotas(agent: Agent) -> str:
    values = []
    for field, setting, _what in QUOTAS.values():
        own = getattr(agent, field)
        if own is None and field in SHOWN_WHEN_SET:
            continue
        shown = f"{getattr(conf, setting)} (default)" if own is None else str(own)
        values.append(f"{field} {shown}")
    return ", ".join(values)
