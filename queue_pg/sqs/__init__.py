"""An SQS-compatible endpoint: boto3 and the AWS SDKs talk to queue_pg unchanged (docs/sqs.md).

Needs the ``sqs`` extra (Starlette, uvicorn): ``pip install 'queue-pg[sqs]'``.
"""

from __future__ import annotations

from queue_pg.sqs.app import create_app

__all__ = ["create_app"]
