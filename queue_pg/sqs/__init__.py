"""An SQS-compatible endpoint: boto3 and the AWS SDKs talk to queue_pg unchanged (docs/sqs.md).

Needs the ``sqs`` extra (Starlette, uvicorn): ``pip install 'queue-pg[sqs]'``. ``create_app``
is imported on first use, so the signature check (:mod:`queue_pg.sqs.sigv4`) loads without them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from queue_pg.sqs.app import create_app

        return create_app
    raise AttributeError(name)
