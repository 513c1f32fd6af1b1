"""Lints every PL/pgSQL function of schema queue_pg with the plpgsql_check extension.

    python tools/plpgsql_check.py [--dsn DSN] [--require] [--performance]

Creates a database of its own on the server of DSN (``QUEUE_PG_TEST_DSN``, else the local
server), migrates it to head, creates the extension there and checks each function with the
other, extra, security and compatibility warnings on (a trigger function against each table it
is attached to). Exits 1 on any finding not in WAIVED, 0 when clean; when the server has no
plpgsql_check it says so and exits 0, or 2 with ``--require`` (CI, where the server must have
it). ``--performance`` also lists the performance hints (hidden casts, volatility), which are
advice to weigh, not faults, so they never fail the run. The database is dropped afterwards.

A finding is waived in the function itself when its cause can be described there (a pragma
for a temporary table, an in-comment option with its reason); WAIVED holds the findings no
pragma can address, each with its reason.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg

# (function, message) -> why it stays
_KEYWORD_NAME = (
    "a documented parameter name (callers pass it by name, quoted); "
    "CREATE OR REPLACE cannot rename an input parameter"
)
WAIVED: dict[tuple[str, str], str] = {
    ("send", 'name of parameter "group" is reserved keyword'): _KEYWORD_NAME,
    ("send_batch", 'name of parameter "group" is reserved keyword'): _KEYWORD_NAME,
    ("message_details", 'name of parameter "group" is reserved keyword'): _KEYWORD_NAME,
    ("message_groups", 'name of parameter "group" is reserved keyword'): _KEYWORD_NAME,
    ("redrive", 'name of parameter "to" is reserved keyword'): _KEYWORD_NAME,
    ("redrive", 'name of parameter "limit" is reserved keyword'): _KEYWORD_NAME,
    ("start_redrive", 'name of parameter "to" is reserved keyword'): _KEYWORD_NAME,
    ("redrive_message", 'name of parameter "to" is reserved keyword'): _KEYWORD_NAME,
    ("_send_rows", 'name of parameter "group" is reserved keyword'): (
        "send's and send_batch's parameter name, passed on; "
        "CREATE OR REPLACE cannot rename an input parameter"
    ),
    ("_queue_sequences", 'name of parameter "create" is reserved keyword'): (
        "renaming an input parameter takes a DROP FUNCTION (CREATE OR REPLACE cannot), "
        "here on every re-apply since the signature stays"
    ),
}

# every PL/pgSQL function of the schema, with the tables a trigger function is attached to
_FUNCTIONS = """
SELECT p.oid::regprocedure::text, p.proname, p.prorettype = 'trigger'::regtype,
       t.tgrelid::regclass::text
FROM pg_catalog.pg_proc p
JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
JOIN pg_catalog.pg_language l ON l.oid = p.prolang
LEFT JOIN pg_catalog.pg_trigger t
       ON p.prorettype = 'trigger'::regtype AND t.tgfoid = p.oid AND NOT t.tgisinternal
WHERE n.nspname = 'queue_pg' AND l.lanname = 'plpgsql'
ORDER BY 1, 3
"""

_CHECK = """
SELECT lineno, level, message, detail, context
FROM public.plpgsql_check_function_tb(
    %(fn)s::regprocedure, coalesce(%(rel)s::regclass, 0), fatal_errors => false,
    other_warnings => true, extra_warnings => true, security_warnings => true,
    compatibility_warnings => true, performance_warnings => %(performance)s)
"""


@dataclass(frozen=True)
class Finding:
    function: str  # its signature
    name: str
    lineno: int | None
    level: str
    message: str
    detail: str | None
    context: str | None

    @property
    def waived(self) -> str | None:
        return WAIVED.get((self.name, self.message))

    @property
    def performance(self) -> bool:
        return self.level == "performance"

    def __str__(self) -> str:
        where = f"{self.function} line {self.lineno}" if self.lineno else self.function
        extra = "; ".join(x for x in (self.detail, self.context) if x)
        return f"{where}: {self.level}: {self.message}" + (f" ({extra})" if extra else "")


class Unavailable(Exception):
    """The server has no plpgsql_check extension to create."""


def available(server_dsn: str) -> bool:
    """Whether the server can create the plpgsql_check extension."""
    with psycopg.connect(server_dsn, autocommit=True) as c:
        row = c.execute(
            "SELECT 1 FROM pg_catalog.pg_available_extensions WHERE name = 'plpgsql_check'"
        ).fetchone()
    return row is not None


def check(server_dsn: str, *, performance: bool = False) -> list[Finding]:
    """Every finding on the schema's PL/pgSQL functions in a fresh migrated database."""
    if not available(server_dsn):
        raise Unavailable(
            "the server has no plpgsql_check extension "
            "(Debian: apt-get install postgresql-<version>-plpgsql-check)"
        )
    from bench.db import scratch_database
    from queue_pg.install import migrate

    with scratch_database(server_dsn, f"queue_pg_plcheck_{uuid.uuid4().hex[:8]}") as dsn:
        migrate(dsn)
        return lint(dsn, performance=performance)


def lint(dsn: str, *, performance: bool = False) -> list[Finding]:
    """Every finding, waived ones included, in the migrated database of dsn (which gets the
    extension)."""
    found: list[Finding] = []
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS plpgsql_check")
        for fn, name, trigger, rel in c.execute(_FUNCTIONS).fetchall():
            if trigger and rel is None:
                found.append(Finding(fn, name, None, "error",
                                     "trigger function attached to no table: not checked",
                                     None, None))
                continue
            rows = c.execute(_CHECK, {"fn": fn, "rel": rel, "performance": performance})
            found.extend(Finding(fn, name, *row) for row in rows.fetchall())
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get(
        "QUEUE_PG_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"),
        help="a server to create the scratch database on")
    parser.add_argument("--require", action="store_true",
                        help="fail (exit 2) when the server has no plpgsql_check")
    parser.add_argument("--performance", action="store_true",
                        help="also list performance hints (never fail the run)")
    args = parser.parse_args(argv)
    try:
        found = check(args.dsn, performance=args.performance)
    except Unavailable as e:
        print(f"plpgsql_check: skipped: {e}", file=sys.stderr)
        return 2 if args.require else 0
    failing = [f for f in found if not f.waived and not f.performance]
    for f in found:
        tag = "waived" if f.waived else "hint" if f.performance else "FAIL"
        print(f"{tag:6} {f}" + (f"  [{f.waived}]" if f.waived else ""))
    print(f"plpgsql_check: {len(failing)} finding(s) to fix, "
          f"{sum(1 for f in found if f.waived)} waived")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
