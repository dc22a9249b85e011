"""How long the README's first command takes from a fresh clone to the printed admin URL.

    .venv/bin/python -m bench.first_run [--source PATH] [--embedded] [--no-pip-cache] [--keep]

Clones `--source` (default: this checkout, its committed HEAD) into a temporary folder, runs
`make demo` there, and times each step from the start of `git clone` by the lines make and the
demo print: the virtual environment, the install, the database, the migrations, and the
`ready:` line with the admin URL. Then it sends Ctrl-C (SIGINT to the process group) and checks
that `make demo` returns. `--embedded` hides DATABASE_URL and points the local-server probe at
a dead port, as on a machine with no PostgreSQL; `--no-pip-cache` installs without pip's cache.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devtools.database import free_port

ROOT = Path(__file__).resolve().parent.parent

#: (what the line starts with or contains, the step it ends).
MILESTONES = [
    ("-m venv", "git clone"),
    ("pip install", "virtual environment"),
    ("manage.py demo", "install"),
    ("demo     | database:", "choosing (and starting) the database"),
    ("demo     | migrations applied", "migrations"),
    ("demo     | ready:", "web server, workers, reaper, seeding"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default=str(ROOT), help="repository to clone")
    parser.add_argument("--embedded", action="store_true", help="no PostgreSQL to be found")
    parser.add_argument("--no-pip-cache", action="store_true", help="PIP_NO_CACHE_DIR=1")
    parser.add_argument("--keep", action="store_true", help="keep the clone")
    options = parser.parse_args()

    env = dict(os.environ)
    if options.embedded:
        env.pop("DATABASE_URL", None)
        env["SWITCHBOARD_LOCAL_POSTGRES"] = f"127.0.0.1:{free_port()}"
    if options.no_pip_cache:
        env["PIP_NO_CACHE_DIR"] = "1"
    folder = Path(tempfile.mkdtemp(prefix="switchboard-first-run-"))
    clone = folder / "switchboard-todos"
    started = time.monotonic()
    subprocess.run(["git", "clone", "--quiet", options.source, str(clone)], check=True)
    demo = subprocess.Popen(
        ["make", "demo", f"DEMO_ARGS=--port {free_port()}"],
        cwd=clone,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert demo.stdout is not None
    steps = iter(MILESTONES)
    marker, step = next(steps)
    last = 0.0
    admin = ""
    for line in demo.stdout:
        if marker not in line:
            continue
        now = time.monotonic() - started
        print(f"{now:7.1f} s  {step} ({now - last:.1f} s)", flush=True)
        last = now
        if "ready:" in line:
            admin = line.split("ready:", 1)[1].split()[0]
            break
        marker, step = next(steps)
    os.killpg(demo.pid, signal.SIGINT)
    demo.communicate(timeout=120)
    print(f"admin URL printed after {last:.1f} s: {admin or 'never'}")
    if options.keep:
        print(f"clone kept in {clone}")
    else:
        subprocess.run(["rm", "-rf", str(folder)], check=True)
    sys.exit(0 if admin else 1)


if __name__ == "__main__":
    main()
