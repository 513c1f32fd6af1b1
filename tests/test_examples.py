"""The examples run as their README prints them: each ```sh block of examples/README.md is one
command, run in a shell from the repository root against a fresh database (``QUEUE_PG_DSN``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import new_database

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = re.findall(r"```sh\n(.*?)```", (ROOT / "examples" / "README.md").read_text(), re.S)


def test_every_example_has_one_command() -> None:
    assert len(COMMANDS) == 2 and all(c.strip().count("\n") == 0 for c in COMMANDS), COMMANDS


@pytest.fixture
def fresh(server_dsn: str) -> Iterator[str]:
    with new_database(server_dsn, "queue_pg_example") as db:
        yield db


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.split()[1])
def test_example_runs_as_printed(command: str, fresh: str) -> None:
    env = {**os.environ, "QUEUE_PG_DSN": fresh,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    done = subprocess.run(command, shell=True, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert re.search(r"ann@example.com'} -> 201", out), out
    assert re.search(r"ann@example.com'} -> 409 .*already signed up", out), out
    assert "-> 400" in out, out
    assert re.search(r"signup ann@example.com: welcomed at \d\d:\d\d:\d\d", out), out
    assert "bob@example.com" not in out.split("-> 400")[-1], out  # rolled back: no row
