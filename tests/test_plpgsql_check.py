"""plpgsql_check finds nothing to fix in schema queue_pg's PL/pgSQL functions (tools/plpgsql_check.py).

Skipped when the server has no plpgsql_check (the embedded server); with
QUEUE_PG_REQUIRE_PLPGSQL_CHECK=1 (CI on Debian's PostgreSQL 15) a missing extension fails instead.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import psycopg
import pytest

from queue_pg.install import migrate

pytestmark = pytest.mark.plpgsql_check


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "plpgsql_check_tool", Path(__file__).resolve().parent.parent / "tools" / "plpgsql_check.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def test_no_finding_but_the_waived(server_dsn: str, scratch: str) -> None:
    tool = _tool()
    if not tool.available(server_dsn):
        if os.environ.get("QUEUE_PG_REQUIRE_PLPGSQL_CHECK") == "1":
            pytest.fail("QUEUE_PG_REQUIRE_PLPGSQL_CHECK=1 but the server has no plpgsql_check")
        pytest.skip("the server has no plpgsql_check extension "
                    "(Debian: apt-get install postgresql-15-plpgsql-check)")
    migrate(scratch)
    found = tool.lint(scratch)
    assert [str(f) for f in found if not f.waived] == []
    # every waiver is still needed: a finding that went away takes its waiver along
    assert {(f.name, f.message) for f in found if f.waived} == set(tool.WAIVED)

    # and a fault is found: a never-read variable, a missing RETURN, a bad column
    with psycopg.connect(scratch, autocommit=True) as c:
        c.execute("""
            CREATE FUNCTION queue_pg._lint_probe(x integer) RETURNS integer LANGUAGE plpgsql AS $$
            DECLARE v integer;
            BEGIN
                v := 1;
                IF x > 0 THEN
                    RETURN (SELECT q.no_such_column FROM queue_pg.queues q LIMIT 1);
                END IF;
            END $$""")
    probe = [f for f in tool.lint(scratch) if f.name == "_lint_probe"]
    messages = " | ".join(f.message for f in probe)
    assert 'never read variable "v"' in messages
    assert "control reached end of function without RETURN" in messages
    assert "no_such_column" in messages
    assert not any(f.waived for f in probe)
