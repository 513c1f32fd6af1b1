"""SQS queue tags: the three SQL functions of sql/api/59_sqs.sql as client calls.

Only the endpoint uses tags, so they are not methods of the client; the calls go through the
client's own statement runner (its pool, its error translation) like its methods do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.types.json import Jsonb

from queue_pg._ops import Call
from queue_pg.aio import AsyncClient


def _nothing(columns: Any, rows: Any) -> None:
    return None


def _tags(columns: Any, rows: Any) -> dict[str, str]:
    return dict(rows[0][0] or {})


async def tag(client: AsyncClient, queue: str, tags: Mapping[str, Any]) -> None:
    call: Call[None] = Call("select queue_pg.sqs_tag_queue(%(queue)s, %(tags)s::jsonb)",
                            {"queue": queue, "tags": Jsonb(dict(tags))}, _nothing)
    await client._run(call, None)


async def untag(client: AsyncClient, queue: str, keys: Sequence[str]) -> None:
    call: Call[None] = Call("select queue_pg.sqs_untag_queue(%(queue)s, %(keys)s::text[])",
                            {"queue": queue, "keys": list(keys)}, _nothing)
    await client._run(call, None)


async def tags(client: AsyncClient, queue: str) -> dict[str, str]:
    call = Call("select queue_pg.sqs_queue_tags(%(queue)s) as result", {"queue": queue}, _tags)
    return await client._run(call, None)
