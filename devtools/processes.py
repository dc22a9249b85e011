"""The demos' child processes: each a `manage.py` command, its output prefixed, stopped cleanly.

Each child runs in a process group of its own, so a Ctrl-C in the terminal reaches the demo
alone and the demo sends each child exactly one SIGTERM: a worker that got two signals would
release its todos instead of finishing them. On Linux a child also gets SIGTERM when the demo
dies, even by SIGKILL, so none outlives it. One thread per child reads its stdout and stderr
and prints them line by line behind the child's name, so several processes interleave
readably.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from typing import TextIO

from django.db import connection

from devtools import database
from devtools.database import BASE_DIR
from switchboard_todos.shutdown import Shutdown

MANAGE = BASE_DIR / "manage.py"
#: How long the children get to stop after SIGTERM: a worker first finishes the todo in hand.
STOP_GRACE = 30.0
#: Lines of each child's output kept for `Child.expect`.
KEPT_LINES = 1000
#: Exit statuses of a child that stopped as asked: runserver dies of SIGTERM, the others exit 0.
STOPPED = (0, -signal.SIGTERM)

_PR_SET_PDEATHSIG = 1
# Looked up before any fork: a child between fork and exec must not load libraries.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def _die_with_parent(parent: int) -> None:
    """In the child before exec: SIGTERM when the process that forked it ends (Linux)."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent ended before the line above took effect
        os._exit(1)


def database_in_words() -> str:
    """Which database this process uses: as chosen (devtools/database.py) or given."""
    chosen = database.chosen()
    if chosen:
        return chosen
    settings = connection.settings_dict
    where = f"{settings['HOST'] or 'localhost'}:{settings['PORT'] or 5432}"
    return f"database {settings['NAME']!r} at {where}, from DATABASE_URL"


class Console:
    """Whole lines from several threads on one stream, each behind the name of who said it."""

    def __init__(self, stream: TextIO, width: int = 8) -> None:
        self.stream = stream
        self.width = width
        self._lock = threading.Lock()

    def say(self, name: str, text: str = "") -> None:
        with self._lock:
            for line in text.splitlines() or [""]:
                self.stream.write(f"{name:<{self.width}} | {line}".rstrip() + "\n")
            self.stream.flush()


class Child:
    """One `manage.py` process, and the thread that prints its output as it comes."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], console: Console) -> None:
        self.name = name
        self.args = args
        #: The exit statuses that mean it ended as intended.
        self.expected: tuple[int, ...] = STOPPED
        self.process = subprocess.Popen(
            [sys.executable, str(MANAGE), *args],
            cwd=BASE_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            process_group=0,
            preexec_fn=functools.partial(_die_with_parent, os.getpid()),
        )
        self.pid = self.process.pid
        self._console = console
        self._lines: deque[str] = deque(maxlen=KEPT_LINES)
        self._seen = threading.Condition()
        self._reader = threading.Thread(target=self._read, name=f"{name}-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._console.say(self.name, line.rstrip("\n"))
            with self._seen:
                self._lines.append(line)
                self._seen.notify_all()
        with self._seen:
            self._seen.notify_all()

    def expect(self, text: str, timeout: float) -> bool:
        """Wait until the child printed a line containing `text`; False if it ended first."""
        deadline = time.monotonic() + timeout
        with self._seen:
            while not any(text in line for line in self._lines):
                left = deadline - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    return False
                self._seen.wait(min(left, 0.5))
        return True

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def signal(self, signum: int) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL it on purpose, and wait until it is gone."""
        self.expected = (-signal.SIGKILL,)
        self.process.kill()
        self.process.wait()

    def close(self) -> None:
        """Wait for the output of an ended child to be printed to its last line."""
        self.process.wait()
        self._reader.join()
        if self.process.stdout is not None:
            self.process.stdout.close()


class Children:
    """The children of one demo, started and stopped together."""

    def __init__(self, console: Console, env: dict[str, str], speaker: str = "demo") -> None:
        self.console = console
        self.env = env
        self.speaker = speaker
        self.started: list[Child] = []

    def start(self, name: str, *args: str) -> Child:
        child = Child(name, list(args), self.env, self.console)
        self.started.append(child)
        self.console.say(
            self.speaker, f"started {name} (pid {child.pid}): manage.py {' '.join(args)}"
        )
        return child

    def ended(self) -> list[Child]:
        """The children that are no longer running."""
        return [child for child in self.started if child.returncode is not None]

    def stop(self, interrupts: Shutdown, grace: float = STOP_GRACE) -> bool:
        """SIGTERM every child once and wait; True when each stopped as asked.

        Another signal to the demo meanwhile sends a second SIGTERM (a worker then releases
        its todos and exits at once); a third, or `grace` seconds, a SIGKILL.
        """
        for child in self.started:
            child.signal(signal.SIGTERM)
        seen = interrupts.count
        strikes = 1
        deadline = time.monotonic() + grace
        while running := [child for child in self.started if child.returncode is None]:
            if interrupts.count > seen:
                seen = interrupts.count
                strikes += 1
            elif time.monotonic() > deadline:
                strikes, deadline = 3, math.inf
            else:
                interrupts.wait(0.05, seen)
                continue
            signum = signal.SIGTERM if strikes == 2 else signal.SIGKILL
            names = ", ".join(child.name for child in running)
            self.console.say(self.speaker, f"sending {signum.name} to {names}")
            for child in running:
                child.signal(signum)
        clean = True
        for child in self.started:
            child.close()
            status = child.process.returncode
            if status == -signal.SIGKILL and status in child.expected:
                self.console.say(self.speaker, f"{child.name} (pid {child.pid}) was killed")
            elif status in child.expected:
                self.console.say(self.speaker, f"{child.name} (pid {child.pid}) stopped")
            else:
                clean = False
                self.console.say(
                    self.speaker, f"{child.name} (pid {child.pid}) ended with status {status}"
                )
        return clean
