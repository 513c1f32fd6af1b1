"""The sync Client is generated from the AsyncClient; both offer the same API."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

from queue_pg import AsyncClient, Client

ROOT = Path(__file__).resolve().parents[2]


def _tool():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("unasync", ROOT / "tools" / "unasync.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sync_client_is_what_the_generator_makes_of_the_async_one() -> None:
    for path, text in _tool().generated().items():
        assert path.read_text() == text, f"{path.name} is stale: run python tools/unasync.py"


def _public(cls: type) -> dict[str, object]:
    """Public methods (and __init__), inherited ones too."""
    names = {n for k in cls.__mro__[:-1] for n in vars(k) if not n.startswith("_")}
    return {n: getattr(cls, n) for n in (*names, "__init__")}


def test_both_clients_have_the_same_methods_parameters_and_docstrings() -> None:
    rename = _tool().rename  # AsyncConnectionPool in one is ConnectionPool in the other
    sync, aio = _public(Client), _public(AsyncClient)
    assert sorted(sync) == sorted(aio)
    for name in sync:
        s, a = inspect.unwrap(getattr(Client, name)), inspect.unwrap(getattr(AsyncClient, name))
        if name != "__init__":
            assert inspect.getdoc(s), f"Client.{name} has no docstring"
        assert inspect.getdoc(s) == rename(inspect.getdoc(a) or ""), name
        sp, ap = inspect.signature(s).parameters, inspect.signature(a).parameters
        assert [(p.name, p.kind, p.default) for p in sp.values()] == [
            (p.name, p.kind, p.default) for p in ap.values()
        ], name
        assert inspect.iscoroutinefunction(a) or name in ("__init__", "open"), name
    assert inspect.getdoc(Client) == rename(inspect.getdoc(AsyncClient) or "")
