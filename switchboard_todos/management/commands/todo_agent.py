"""`manage.py todo_agent`: create remote agents, rotate or revoke their tokens, list them."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from switchboard_todos.agents import accounts
from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.management.base import OperatorCommand
from switchboard_todos.management.cli import queue_name
from switchboard_todos.models import Agent


class Command(OperatorCommand):
    help = (
        "Manage the remote agents that work the queues over HTTP or MCP. `create` and `rotate` "
        "print the new token alone on the last line: it is shown only this once (only its hash "
        "is stored). `revoke` refuses the agent's token from now on; `rotate` gives a new one "
        "and makes a revoked agent active again. `sqs-credentials` prints the agent's SQS "
        "access key and secret as two shell lines (docs/sqs.md); rotating the token rotates them."
    )

    examples = [
        "manage.py todo_agent create triage-bot --queue github --queue mail",
        "manage.py todo_agent create planner --queue plans --create-queue github",
        "manage.py todo_agent rotate triage-bot",
        "manage.py todo_agent revoke triage-bot",
        "manage.py todo_agent list",
        "manage.py todo_agent sqs-credentials triage-bot",
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
            self._show_token(f"Created agent {agent.name!r}: {_grants(agent)}.", token)
            return
        agent = self._agent(options["name"])
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
                f"{agent.name}\t{status}\t{agent.token_prefix}…\tlast seen {seen}\t{_grants(agent)}"
            )


def _grants(agent: Agent) -> str:
    claims = ", ".join(agent.claim_queues) or "no queue"
    creates = ", ".join(agent.create_queues) or "no queue"
    return f"claims from {claims}; creates in {creates}"
