"""MkDocs hook: the Sphinx roles of the package's docstrings (``:meth:`send```) as code.

mkdocstrings renders docstrings as Markdown, where a role is left as ``:meth:`` before the
code span; here each becomes the code span alone (``send()``, ``~a.b.C`` as ``C``).
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(meth|func|class|mod|attr|data|exc|obj):<code>(~?)([^<]*)</code>")


def _code(m: re.Match[str]) -> str:
    role, short, target = m.groups()
    name = target.rsplit(".", 1)[-1] if short else target
    if role in ("meth", "func") and not name.endswith(")"):
        name += "()"
    return f"<code>{name}</code>"


def on_page_content(html: str, **kwargs: Any) -> str:
    return _ROLE.sub(_code, html)
