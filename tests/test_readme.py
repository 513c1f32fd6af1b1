"""The front door: the README stays short, its quick start runs as printed, and its links and the
documentation site's pages are where they say."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import new_database

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"


def _section(text: str, title: str) -> str:
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_readme_is_at_most_250_lines() -> None:
    assert README.count("\n") <= 250


def test_getting_started_shows_the_same_quick_start() -> None:
    [readme] = _python_blocks(_section(README, "Quick start"))
    page = (DOCS / "getting-started.md").read_text()
    assert readme in _python_blocks(_section(page, "Python"))


@pytest.fixture
def fresh(server_dsn: str) -> Iterator[str]:
    with new_database(server_dsn, "queue_pg_readme") as db:
        yield db


@pytest.mark.slow
def test_quick_start_runs_as_printed(fresh: str, tmp_path: Path) -> None:
    [code] = _python_blocks(_section(README, "Quick start"))
    env = {**os.environ, "QUEUE_PG_DSN": fresh,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for _ in range(2):  # and again, as a user re-running it would
        done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout == "welcome mail to ann@example.com\n", done.stdout + done.stderr


def test_readme_links_lead_somewhere() -> None:
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README):
        assert (ROOT / target).exists(), target


def test_site_lists_every_page() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(nav: object) -> Iterator[str]:
        if isinstance(nav, str):
            yield nav
        elif isinstance(nav, list):
            for item in nav:
                yield from pages(item)
        elif isinstance(nav, dict):
            for value in nav.values():
                yield from pages(value)

    assert sorted(pages(config["nav"])) == sorted(p.name for p in DOCS.glob("*.md"))


@pytest.mark.parametrize("page", [*sorted(p.name for p in DOCS.glob("*.md")), "README.md"])
def test_docs_speak_of_machines_and_commands(page: str) -> None:
    """Not of the history of the work: no "this stop", "the issue's targets", "seed 001"."""
    text = (ROOT / "README.md" if page == "README.md" else DOCS / page).read_text()
    found = re.findall(r"\b(?:this|previous|earlier) stop\b|\bthe issue\b|\bseed \d|\btargets\b",
                       text, re.I)
    assert not found, found


def test_ci_runs_the_readme_test_command() -> None:
    [command] = re.findall(r"&& (python -m pytest)\n", _section(README, "Set up"))
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"TEST_COMMAND=({command})" in ci
    assert "mkdocs build --strict" in ci
