"""Locate the SQL and Alembic files, whether installed from a wheel or run from a checkout.

The wheel ships the repo's top-level ``sql/`` and ``migrations/`` as ``queue_pg/sql`` and
``queue_pg/migrations`` (hatch force-include); a checkout or editable install has them one level
above the package. Everything that needs SQL goes through here so both layouts behave the same.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def _find(name: str, marker: str) -> Path:
    """The packaged copy wins, so an installed wheel never reads a stray checkout's files."""
    for candidate in (_PACKAGE_DIR / name, _PACKAGE_DIR.parent / name):
        if (candidate / marker).exists():
            return candidate
    raise FileNotFoundError(
        f"queue_pg cannot find its {name}/ folder (looked in {_PACKAGE_DIR / name} and "
        f"{_PACKAGE_DIR.parent / name}); the installation is incomplete"
    )


def sql_dir() -> Path:
    """Folder holding ``schema/`` (one file per revision) and ``api/`` (re-applied functions)."""
    return _find("sql", "schema")


def migrations_dir() -> Path:
    """Alembic script location (``env.py``, ``versions/``)."""
    return _find("migrations", "env.py")


def schema_files() -> list[Path]:
    """Table definitions in revision order; each belongs to exactly one Alembic revision."""
    return sorted((sql_dir() / "schema").glob("*.sql"))


def api_files() -> list[Path]:
    """Functions and views, all ``CREATE OR REPLACE``, applied in file-name order."""
    api = sql_dir() / "api"
    return sorted(api.glob("*.sql")) if api.is_dir() else []


def read(path: Path) -> str:
    """Read a SQL file as UTF-8 whatever the locale, since the SQL may contain non-ASCII text."""
    return path.read_text(encoding="utf-8")


def api_checksum() -> str:
    """Fingerprint of the api files, stored in the database to skip re-applying identical SQL."""
    digest = hashlib.sha256()
    for path in api_files():
        digest.update(path.name.encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()
