"""`manage.py todo_agent`: create remote agents, rotate or revoke their tokens, list them."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from argparse import SUPPRESS, ArgumentParser, ArgumentTypeError
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
        "It refuses while a new process of these settings would derive another server key (a "
        "SECRET_KEY made anew at each start): the secret would be refused. `limits` sets the "
        "agent's quotas (`default`: the SWITCHBOARD_TODOS_AGENT_* setting), or shows them; "
        "`--preset broker` gives those of an agent Celery or dramatiq uses (docs/celery.md)."
    )

    examples = [
        "manage.py todo_agent create triage-bot --queue github --queue mail",
        "manage.py todo_agent create planner --queue plans --create-queue github",
        "manage.py todo_agent rotate triage-bot",
        "manage.py todo_agent revoke triage-bot",
        "manage.py todo_agent list",
        "manage.py todo_agent sqs-credentials triage-bot",
        "manage.py todo_agent create celery --queue celery --create-queue celery --preset broker",
        "manage.py todo_agent limits celery --preset broker",
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
        if action == "sqs-credentials":
            self._refuse_a_key_of_this_process()
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

    def _refuse_a_key_of_this_process(self) -> None:
        """CommandError when a new process of these settings derives another server key (a
        SECRET_KEY made anew at each start, as the example project's under DEBUG=1 without
        one): the secret printed would be refused by the server, and by every later run.

        Refused rather than warned about: the secret is then certain to fail, and a warning
        is lost where the output is sourced or captured. A new process is asked because only
        that tells a key made at each start from a fixed one written in the settings."""
        from switchboard_todos.sqs.signing import server_key

        settings_module = os.environ.get("DJANGO_SETTINGS_MODULE")
        if not settings_module:  # settings.configure(): no settings a new process could load
            return
        derived = _key_digest_of_a_new_process()
        if derived is None:
            self.stderr.write(
                f"Warning: a new process of {settings_module} could not be asked which SQS "
                "server key it derives; if SECRET_KEY is made anew at each start, the secret "
                "below will be refused (SignatureDoesNotMatch)."
            )
            return
        if derived != key_digest(server_key()):
            raise CommandError(
                "SQS secrets are derived from a server key (SWITCHBOARD_TODOS_SQS_KEY, else "
                f"SECRET_KEY) that every process of {settings_module} makes anew: a new process "
                "derived another. A secret printed here would be refused by the server "
                "(SignatureDoesNotMatch), as would one from any later run. Give SECRET_KEY, or "
                "SWITCHBOARD_TODOS_SQS_KEY, one fixed value that the server and this command "
                "share (the example project reads SECRET_KEY from the environment, and makes "
                "one at each start under DEBUG=1 without it), then run this again."
            )

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


#: The longest wait, in seconds, for the new process that derives the server key again.
PROBE_TIMEOUT = 60
#: Run by a new process of the same settings: prints the digest of the server key it derives.
_NEW_PROCESS_KEY_DIGEST = (
    "import django; django.setup(); "
    "from switchboard_todos.management.commands.todo_agent import key_digest; "
    "from switchboard_todos.sqs.signing import server_key; "
    "print(key_digest(server_key()))"
)


def key_digest(key: str) -> str:
    """A digest of a server key: two processes compare their keys without printing either."""
    return hashlib.sha256(key.encode()).hexdigest()


def _key_digest_of_a_new_process() -> str | None:
    """key_digest of the server key a new process of these settings, environment and import
    path derives; None when it could not tell (it failed, or took PROBE_TIMEOUT)."""
    path = os.pathsep.join(entry or os.getcwd() for entry in sys.path)
    try:
        probe = subprocess.run(
            [sys.executable, "-c", _NEW_PROCESS_KEY_DIGEST],
            env={**os.environ, "PYTHONPATH": path},
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return None
    printed = probe.stdout.splitlines()  # the last line: the settings may print lines of their own
    return printed[-1] if probe.returncode == 0 and printed else None


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
    "--max-fails-per-minute": (
        "max_fails_per_minute",
        "AGENT_MAX_FAILS_PER_MINUTE",
        "todos it may fail or release per minute",
    ),
    "--burst-seconds": (
        "burst_seconds",
        "AGENT_BURST_SECONDS",
        "seconds' worth of its quotas a minute it may spend at once, 1 to 60",
    ),
}
DEFAULT = "default"
#: Quotas shown only where the agent has its own: the line of every agent would otherwise end in
#: the same long number of bytes, and the same fails.
SHOWN_WHEN_SET = {"max_bytes_per_minute", "max_fails_per_minute", "burst_seconds"}
#: The most seconds' worth of a minute's quotas an agent may spend at once: the whole minute.
MAX_BURST_SECONDS = 60


def _quota_options(parser: ArgumentParser, kind: Callable[[str], int | None]) -> None:
    presets = "; ".join(
        f"{name}: " + ", ".join(f"{field} {value}" for field, value in quotas.items())
        for name, quotas in accounts.QUOTA_PRESETS.items()
    )
    parser.add_argument(
        "--preset",
        choices=accounts.QUOTA_PRESETS,
        help=f"Set the quotas of a kind of agent ({presets}); the quota options given win.",
    )
    for flag, (field, setting, what) in QUOTAS.items():
        parser.add_argument(
            flag,
            dest=field,
            type=_within_a_minute(kind) if field == "burst_seconds" else kind,
            default=SUPPRESS,  # left out: unchanged
            metavar="N",
            help=f"Most {what}; default: SWITCHBOARD_TODOS_{setting}.",
        )


def _within_a_minute(kind: Callable[[str], int | None]) -> Callable[[str], int | None]:
    """`kind`, at most MAX_BURST_SECONDS: a burst is never more than the minute it is of."""

    def parse(text: str) -> int | None:
        value = kind(text)
        if value is not None and value > MAX_BURST_SECONDS:
            raise ArgumentTypeError(f"{text!r} must be at most {MAX_BURST_SECONDS}")
        return value

    return parse


def _quota(text: str) -> int | None:
    """A quota of 1 or more, or `default` (None: the setting)."""
    return None if text == DEFAULT else positive_int(text)


def _set_quotas(agent: Agent, options: dict[str, Any]) -> None:
    """Set the quotas of the preset, then those given as options; None (`limits --max-held
    default`) is the setting."""
    given: dict[str, int | None] = dict(accounts.QUOTA_PRESETS.get(options["preset"] or "", {}))
    given.update(
        (field, options[field]) for field, _setting, _what in QUOTAS.values() if field in options
    )
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
