"""Headless Chromium for the browser tests: Playwright driving Debian's ``chromium``
($QUEUE_PG_CHROMIUM or the one on PATH) through ``executable_path``, never a downloaded browser.
Importing this module skips the importing test module when either is missing; the ``browser``
fixture (tests/conftest.py) launches one Chromium a module through :func:`launched`."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (the [test] extra)")
CHROMIUM = os.environ.get("QUEUE_PG_CHROMIUM") or shutil.which("chromium")
if CHROMIUM is None or not os.access(CHROMIUM, os.X_OK):
    pytest.skip(f"needs Debian's chromium (apt-get install chromium); not at {CHROMIUM}",
                allow_module_level=True)


@contextmanager
def launched() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        # --no-sandbox: Chromium's sandbox refuses to run as root, as CI and containers do
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()
