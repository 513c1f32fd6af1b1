"""One source per contract: each rule the SQL states, and every copy of it elsewhere (Python
classes, the CLI, the Django models, the SQLAlchemy tables, the docs), held together here, so a
copy changed alone fails a test. The SQL is the source: read from sql/api or from the migrated
database."""

from __future__ import annotations

import ast
import dataclasses
import re
import typing
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

import queue_pg
from queue_pg import _ops, tables, types
from queue_pg.errors import SQLSTATE_ERRORS, InvalidParameter, QueueError
from queue_pg.ops.cli import main
from queue_pg.ops.cli.params import SETTING_OPTIONS
from queue_pg.ops.display import settings_rows

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# --- SQLSTATE codes: sql/api <-> errors.py <-> docs/errors.md ------------------------------------


def _sql_codes() -> set[str]:
    """The QP codes sql/api raises to callers (QP9xx are private: raised and caught inside)."""
    return {code for path in (ROOT / "sql" / "api").glob("*.sql")
            for code in re.findall(r"'(QP\d{3})'", path.read_text()) if code < "QP900"}


def test_private_codes_are_caught_where_they_are_raised() -> None:
    for path in (ROOT / "sql" / "api").glob("*.sql"):
        text = path.read_text()
        for code in set(re.findall(r"ERRCODE = '(QP9\d\d)'", text)):
            assert f"WHEN SQLSTATE '{code}'" in text, f"{path.name} raises {code} but never catches it"
            assert code not in SQLSTATE_ERRORS


def _docs_codes() -> dict[str, str]:
    """SQLSTATE -> class name, from the table of docs/errors.md."""
    text = (DOCS / "errors.md").read_text()
    return dict(re.findall(r"^\| (QP\d{3}) \| `(\w+)` \|", text, re.M))


def test_every_sql_code_has_one_class_and_one_docs_row() -> None:
    ours = {code for code in SQLSTATE_ERRORS if code.startswith("QP")}
    assert _sql_codes() == ours, "a QP code raised in sql/api without a class, or the reverse"
    documented = _docs_codes()
    assert set(documented) == ours, "docs/errors.md lists other codes than errors.py maps"
    for code, name in documented.items():
        assert SQLSTATE_ERRORS[code].__name__ == name, code


# --- queue settings: create_queue / alter_queue <-> every place that lists them -----------------

#: SQL type -> (psycopg's name in _ops, Python type, Django field, SQLAlchemy type)
KINDS = {
    "double precision": ("float8", float, "FloatField", "DOUBLE_PRECISION"),
    "integer": ("int", int, "IntegerField", "Integer"),
    "text": ("text", str, "TextField", "Text"),
    "boolean": ("bool", bool, "BooleanField", "Boolean"),
}


def _arguments(conn: psycopg.Connection, function: str) -> dict[str, str]:
    row = conn.execute("SELECT pg_get_function_arguments(%s::regproc)", [function]).fetchone()
    assert row is not None
    found = {}
    for arg in row[0].split(", "):
        name, kind = re.match(r"(\w+) ([\w ]+?(?:\[\])?)(?: DEFAULT .*)?$", arg).groups()  # type: ignore[union-attr]
        found[name] = kind
    return found


@pytest.fixture(scope="module")
def settings(dsn: str) -> dict[str, str]:
    """Setting -> SQL type, from create_queue's signature (its first parameter is the name)."""
    with psycopg.connect(dsn) as conn:
        created = _arguments(conn, "queue_pg.create_queue")
        altered = _arguments(conn, "queue_pg.alter_queue")
    assert created.pop("name") == "text"
    assert altered.pop("name") == "text" and altered.pop("clear") == "text[]"
    assert altered == created, "alter_queue takes other settings than create_queue"
    return created


def _plain(hint: object) -> set[type]:
    """The Python types a hint allows, without None and timedelta (durations take both)."""
    args = typing.get_args(hint) or (hint,)
    found: set[type] = set()
    for arg in args:
        found |= _plain(arg) if typing.get_args(arg) else {arg}  # type: ignore[arg-type]
    return found - {type(None), timedelta}


def test_python_types_list_the_settings(settings: dict[str, str]) -> None:
    hints = typing.get_type_hints(types.QueueSettings)
    assert list(hints) == list(settings)
    for name, kind in settings.items():
        allowed = _plain(hints[name])
        want = KINDS[kind][1]
        assert want in allowed and allowed <= ({float, int} if want is float else {want}), name
    config = [f.name for f in dataclasses.fields(types.QueueConfig)]
    assert config == ["name", *settings, "created_at"]


def test_statement_builder_lists_the_settings(settings: dict[str, str]) -> None:
    assert set(settings) == _ops.SETTINGS
    assert dict(_ops._SETTING_TYPES) == {
        name: KINDS[kind][0] for name, kind in settings.items()
    }


def test_sqlalchemy_table_lists_the_settings(settings: dict[str, str], dsn: str) -> None:
    columns = {c.name: type(c.type).__name__ for c in tables.queues.columns}
    assert [c for c in columns if c in settings] == list(settings)
    with psycopg.connect(dsn) as conn:  # the tuning settings have a function of their own
        tuning = _arguments(conn, "queue_pg.alter_tuning")
    assert tuning.pop("queue") == "text" and tuning.pop("clear") == "text[]"
    assert set(columns) - set(settings) == {"id", "name", "options", "created_at", "has_routes",
                                            *tuning}
    for name, kind in settings.items():
        assert columns[name] == KINDS[kind][3], name


def test_django_model_lists_the_settings(settings: dict[str, str]) -> None:
    source = (ROOT / "queue_pg" / "contrib" / "django" / "models.py").read_text()
    [queue] = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Queue"]
    fields = {
        target.id: node.value.func.attr
        for node in queue.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute)
        for target in node.targets if isinstance(target, ast.Name)
    }
    assert set(fields) - set(settings) == {"id", "name", "created_at"}
    for name, kind in settings.items():
        assert fields[name] == KINDS[kind][2], name


def test_cli_options_list_the_settings(settings: dict[str, str]) -> None:
    assert [name for name, _, _ in SETTING_OPTIONS] == list(settings)
    for command, extra in ((main.commands["create"], set()), (main.commands["alter"], {"clear"})):
        params = {p.name for p in command.params} - {"name"}
        assert params == set(settings) | extra, command.name


def test_cli_shows_every_setting(settings: dict[str, str]) -> None:
    values = {"int": 1, "float8": 1.0, "text": "x", "bool": True}
    row = types.QueueConfig(name="q", created_at=None,  # type: ignore[arg-type]
                            **{n: values[_ops._SETTING_TYPES[n]] for n in settings})
    assert [name for name, _ in settings_rows(row)] == list(settings)


def _column_defaults(conn: psycopg.Connection) -> dict[str, str | None]:
    rows = conn.execute(
        "SELECT column_name, column_default FROM information_schema.columns"
        " WHERE table_schema = 'queue_pg' AND table_name = 'queues'"
    ).fetchall()
    return {name: None if default is None else re.sub(r"^'?(.*?)'?(::[\w ]+)?$", r"\1", default)
            for name, default in rows}


def test_docs_settings_table_lists_every_setting_with_its_default(
    settings: dict[str, str], dsn: str
) -> None:
    text = (DOCS / "settings.md").read_text()
    table = text.split("\n\n| setting |", 1)[1].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", table, re.M))
    assert list(rows) == list(settings)
    with psycopg.connect(dsn) as conn:
        defaults = _column_defaults(conn)
    for name in settings:
        want = defaults[name]
        assert rows[name] == ("NULL" if want is None else want), name


#: What a setting needs beside it to be tried at the ends of its range on its own.
COMPANIONS: dict[str, dict[str, object]] = {
    "visibility_timeout": {"max_lease": 604800},
    "max_lease": {"visibility_timeout": 0},
    "max_receive_count": {"dead_letter_queue": "ranges-dlq"},
    "delay": {"message_ttl": 3153600000},  # a delay must end before the time-to-live
}


def test_docs_settings_ranges_are_the_ones_sql_enforces(client: queue_pg.Client) -> None:
    text = (DOCS / "settings.md").read_text()
    table = text.split("\n\n| setting |", 1)[1].split("\n\n", 1)[0]
    ranges = re.findall(r"^\| `(\w+)` \| [^|]+ \| (>\s*)?(\d+) \u2013 (\d+)\b", table, re.M)
    assert len(ranges) >= 8, ranges
    client.create_queue("ranges-dlq")
    for name, exclusive, low, high in ranges:
        extra = COMPANIONS.get(name, {})
        accepted = [int(high)] if exclusive else [int(low), int(high)]
        refused = [int(high) + 1, int(low) if exclusive else int(low) - 1]
        for value in accepted:
            client.create_queue("ranges", **{name: value, **extra})  # type: ignore[arg-type]
            client.drop_queue("ranges")
        for value in refused:
            with pytest.raises(InvalidParameter, match=name):
                client.create_queue("ranges", **{name: value, **extra})  # type: ignore[arg-type]


def test_docs_sql_api_lists_every_function_and_view(conn: psycopg.Connection) -> None:
    rows = conn.execute(
        "SELECT proname FROM pg_proc WHERE pronamespace = 'queue_pg'::regnamespace"
        " AND proname !~ '^_' UNION SELECT relname FROM pg_class"
        " WHERE relnamespace = 'queue_pg'::regnamespace AND relkind = 'v'"
    ).fetchall()
    page = (DOCS / "sql-api.md").read_text()
    missing = [name for (name,) in rows if f"`{name}" not in page and f" `{name}`" not in page]
    assert not missing, missing


def test_docs_python_api_shows_every_public_name() -> None:
    page = (DOCS / "python-api.md").read_text()
    shown = set(re.findall(r"^::: queue_pg\.(\w+)$", page, re.M))
    missing = set(queue_pg.__all__) - shown - {"__version__"} - {
        name for name in queue_pg.__all__
        if isinstance(getattr(queue_pg, name), type)
        and issubclass(getattr(queue_pg, name), QueueError)  # shown with queue_pg.errors
    } - {"Seconds"}
    assert not missing, missing
