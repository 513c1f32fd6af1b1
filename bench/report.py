"""What every scenario reports: the machine, latency summaries, and the JSON + Markdown files.

The JSON is the record (machine, parameters, figures, plans); the Markdown is a table ready to
paste into the README. Later scenarios add charts beside them; this module keeps no state.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = [
    "DEFAULT_OUT",
    "LatencySummary",
    "SuiteResult",
    "command_line",
    "machine_info",
    "machine_line",
    "markdown_table",
    "percentile",
    "redact_dsn",
    "report_suite",
    "write_results",
]

#: Where results go unless ``--out`` says otherwise: ``bench/results`` beside this file.
DEFAULT_OUT = Path(__file__).resolve().parent / "results"

#: Server settings that move the figures; recorded with every result.
_SERVER_SETTINGS = (
    "shared_buffers",
    "effective_cache_size",
    "work_mem",
    "maintenance_work_mem",
    "random_page_cost",
    "synchronous_commit",
    "fsync",
    "jit",
    "max_connections",
    "autovacuum",
    "autovacuum_naptime",
)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of already sorted values, linear between ranks (as numpy)."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclasses.dataclass(frozen=True)
class LatencySummary:
    """Latencies of n operations, in milliseconds."""

    n: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> LatencySummary:
        """Summary of latencies given in seconds."""
        ms = sorted(s * 1000.0 for s in seconds)
        if not ms:
            return cls(0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
        return cls(
            n=len(ms),
            p50_ms=percentile(ms, 50),
            p90_ms=percentile(ms, 90),
            p99_ms=percentile(ms, 99),
            mean_ms=sum(ms) / len(ms),
            min_ms=ms[0],
            max_ms=ms[-1],
        )


def redact_dsn(dsn: str) -> str:
    """The DSN without its password, fit to be written into a result file."""
    if dsn == "embedded":  # the --dsn keyword, not a DSN
        return dsn
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable dsn>"
    return make_conninfo(dsn, password="***") if params.get("password") else dsn


def command_line(argv: Sequence[str]) -> str:
    """The command that reproduces a run (``argv`` after ``-m bench``), password hidden."""
    shown = list(argv)
    for i, a in enumerate(shown):
        if a == "--dsn" and i + 1 < len(shown):
            shown[i + 1] = redact_dsn(shown[i + 1])
        elif a.startswith("--dsn="):
            shown[i] = "--dsn=" + redact_dsn(a[len("--dsn=") :])
    return "python -m bench " + " ".join(shlex.quote(a) for a in shown)


def cpu_seconds(pid: int | str) -> float:
    """CPU time (user + system) process ``pid`` has used so far, from /proc (Linux only)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and commit else None


def machine_info(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """The client machine, the server under test and the software versions."""
    with conn.cursor() as cur:
        cur.execute("SELECT version(), current_setting('server_version')")
        row = cur.fetchone()
        assert row is not None
        version, short = row
        cur.execute(
            "SELECT name, current_setting(name) FROM unnest(%s::text[]) AS name",
            [list(_SERVER_SETTINGS)],
        )
        settings = dict(cur.fetchall())
    ram = _ram_bytes()
    host = conn.info.host
    try:
        load: list[float] | None = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "ram_gib": round(ram / 2**30, 1) if ram else None,
        "cpu_model": _cpu_model(),
        "os": platform.platform(),
        "load_average": load,  #: 1, 5, 15 minutes, when the run began: other work on the box
        "python": sys.version.split()[0],
        "psycopg": psycopg.__version__,
        "postgresql": short,
        "postgresql_version": version,
        "server_local": host in ("127.0.0.1", "::1", "localhost") or host.startswith("/"),
        "server_settings": settings,
        "git_commit": _git_commit(),
    }


def machine_line(machine: dict[str, Any]) -> str:
    """One line for a Markdown report: what the figures were measured on."""
    where = "on the same machine" if machine.get("server_local") else "over the network"
    return (
        f"{machine['cores']} cores ({machine['cpu_model']}), {machine['ram_gib']} GiB RAM, "
        f"PostgreSQL {machine['postgresql']} {where} "
        f"(shared_buffers {machine['server_settings'].get('shared_buffers')}), "
        f"Python {machine['python']}, psycopg {machine['psycopg']}; {machine['date']}"
        + (f", load average {machine['load_average'][0]}" if machine.get("load_average") else "")
    )


def markdown_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None
) -> str:
    """A GitHub Markdown table. ``align``: one of ``l``/``r``/``c`` per column (default l)."""
    spec = (align or "l" * len(headers)).ljust(len(headers), "l")
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join(marks[a] for a in spec) + "|",
    ]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def write_results(out: Path, name: str, data: dict[str, Any], markdown: str) -> list[Path]:
    """Write ``<out>/<name>.json`` and ``<out>/<name>.md``; returns both paths."""
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{name}.json"
    md_path = out / f"{name}.md"
    json_path.write_text(
        json.dumps(data, indent=2, default=_jsonable, allow_nan=True) + "\n", encoding="utf-8"
    )
    md_path.write_text(markdown.rstrip() + "\n", encoding="utf-8")
    return [json_path, md_path]


def save_scenario(args: Any, name: str, machine: dict[str, Any], parameters: dict[str, Any],
                  results: Any, markdown: str, log: Callable[[str], None],
                  **extra: Any) -> int:
    """A scenario's results as every one keeps them (its name, the redacted DSN, the machine,
    its parameters, its figures and any ``extra`` keys) in ``args.out``; the paths logged.
    Returns the scenario's exit code, 0."""
    data = {"scenario": name, "dsn": redact_dsn(args.dsn), "machine": machine,
            "parameters": parameters, "results": results, **extra}
    for path in write_results(args.out, name, data, markdown):
        log(f"wrote {path}")
    return 0


@dataclasses.dataclass
class SuiteResult:
    """The outcome of every test of a third-party suite (moto's, Azurite's), by its id, beside
    the failures ``expected`` there (each with its reason, listed in the docs)."""

    expected: Mapping[str, str]
    outcomes: dict[str, str] = dataclasses.field(default_factory=dict)
    messages: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def passed(self) -> int:
        return sum(1 for o in self.outcomes.values() if o == "passed")

    @property
    def failed(self) -> list[str]:
        return sorted(k for k, o in self.outcomes.items() if o == "failed")

    @property
    def unexpected(self) -> list[str]:
        """Failures not among the expected ones."""
        return [k for k in self.failed if k not in self.expected]

    @property
    def fixed(self) -> list[str]:
        """Expected failures that did not fail."""
        return sorted(k for k in self.expected if self.outcomes.get(k) != "failed")

    def problems(self, min_passed: int) -> list[str]:
        """What makes the run a failure ([] when the suite ran, at least ``min_passed`` passed,
        and exactly the expected tests failed)."""
        out = []
        if len(self.outcomes) < min_passed:
            out.append(f"the suite did not run ({len(self.outcomes)} outcomes)")
        if self.unexpected:
            details = {k: self.messages.get(k, "") for k in self.unexpected}
            out.append(f"failures not in the expected list: {details}")
        if self.fixed:
            out.append(f"listed as failing but passed (take them off the list): {self.fixed}")
        if self.passed < min_passed:
            out.append(f"{self.passed} passed, fewer than {min_passed}")
        return out


def report_suite(result: SuiteResult, *, scenario: str, heading: str, skipped: str,
                 command: str, out: str | None, log: Any, min_passed: int,
                 partial: bool) -> int:
    """Write a suite's results (``<scenario>.md`` / ``.json`` with snake_case name) and log
    them; the exit code: 1 when a whole run (not ``partial``) has problems."""
    ran = sum(1 for o in result.outcomes.values() if o != "skipped")
    lines = [f"# {heading}: {result.passed} of {ran} pass", "",
             f"`{command}` — {ran - result.passed} fail, {len(result.outcomes) - ran} {skipped}",
             "", "| failing test | why |", "|---|---|"]
    lines += [f"| `{k}` | {result.expected.get(k) or 'UNEXPECTED: ' + result.messages.get(k, '')}"
              " |" for k in result.failed]
    lines += [f"| `{k}` | listed as failing, but passed |" for k in result.fixed]
    markdown = "\n".join(lines)
    data = {"scenario": scenario, "command": command, "passed": result.passed,
            "ran": ran, "skipped": len(result.outcomes) - ran,
            "failed": result.failed, "unexpected": result.unexpected, "fixed": result.fixed}
    for path in write_results(Path(out or DEFAULT_OUT), scenario.replace("-", "_"), data,
                              markdown):
        log(f"wrote {path}")
    log(markdown)
    if partial:
        return 0
    log(f"unexpected failures: {result.unexpected or 'none'}; expected failures that passed:"
        f" {result.fixed or 'none'}")
    return 1 if result.problems(min_passed) else 0
