"""An Azure Queue Storage-compatible endpoint: the Azure SDKs talk to queue_pg (docs/azure.md).

Needs the ``azure`` extra (Starlette, uvicorn): ``pip install 'queue-pg[azure]'``.
``create_app`` is imported on first use, so the signature checks (:mod:`queue_pg.azure.auth`)
load without them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from queue_pg.azure.app import create_app

        return create_app
    raise AttributeError(name)
