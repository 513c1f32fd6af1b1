"""Scenario "azure": the Azure SDK's worker loop against ``queue-pg azure`` beside the same loop
against Azurite, Microsoft's Azure Storage emulator.

The loop is the Python SDK's (``azure-storage-queue``, one synchronous ``QueueClient``, Shared
Key signing): send N messages one a call (Put Message), then receive them 32 a call (Get
Messages) and delete each (Delete Message: Azure has no batch delete) until the queue is empty.
The figure is messages a second of the whole loop (N / its time); send and drain are given apart
too. Both servers run on loopback in processes of their own: ``queue-pg azure`` (uvicorn, one
worker, authentication on, its account key sealed as always) on a scratch database, and Azurite's
queue service (``azurite-queue --inMemoryPersistence``). Rounds take turns (endpoint, Azurite,
then Azurite, endpoint, ...), each on a queue of its own, so a drift of the machine's load falls
on both; the medians are compared.

Setup: Azurite comes from npm into ``--azurite-dir`` (default: ``queue_pg_bench_azurite`` in
the temp folder) the first time, at the version of :data:`AZURITE`; ``--no-azurite`` skips it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench import Scenario, db
from bench.report import (
    DEFAULT_OUT,
    machine_info,
    machine_line,
    markdown_table,
    redact_dsn,
    write_results,
)
from bench.sqs import _free_port

__all__ = ["AZURITE", "SCENARIO", "run"]

RESULT_NAME = "azure"
#: The Azurite release the benchmark installs (npm): the last that runs on Node.js 20.
AZURITE = "3.35.0"
#: Azurite's well-known account (its default).
EMULATOR_ACCOUNT = "devstoreaccount1"
EMULATOR_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
                "KBHBeksoGMGw==")
BODY = '{"n": 0, "payload": "' + "x" * 64 + '"}'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=500,
                        help="messages a round at scale 1 (default 500)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per server (default 4)")
    parser.add_argument("--azurite-dir", default=str(Path(tempfile.gettempdir())
                                                      / "queue_pg_bench_azurite"),
                        help="where Azurite is installed from npm (once)")
    parser.add_argument("--no-azurite", action="store_true", help="the endpoint only")
    parser.add_argument("--with-no-auth", action="store_true",
                        help="also the endpoint with --no-auth (no key check, no signature"
                             " check: what authentication costs)")


def azurite_bin(folder: Path, log: Callable[[str], None]) -> Path | str:
    """azurite-queue in ``folder``, installed from npm first if it is not there; or why not."""
    exe = folder / "node_modules" / ".bin" / "azurite-queue"
    installed = folder / "node_modules" / "azurite" / "package.json"
    if exe.exists() and f'"version": "{AZURITE}"' in installed.read_text():
        return exe
    if shutil.which("npm") is None:
        return "n/a (npm is not installed)"
    folder.mkdir(parents=True, exist_ok=True)
    log(f"installing azurite@{AZURITE} from npm into {folder}...")
    done = subprocess.run(["npm", "install", "--prefix", str(folder), "--no-audit", "--no-fund",
                           "--loglevel=error", f"azurite@{AZURITE}"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0 or not exe.exists():
        return f"n/a (npm install azurite failed: {done.stderr.strip()[-200:]})"
    return exe


@contextlib.contextmanager
def _listening(argv: list[str], port: int,
               env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    server = subprocess.Popen(argv, env=env or os.environ.copy(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        import socket

        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{argv[0]} did not start") from None
                time.sleep(0.1)
        yield server
    finally:
        server.terminate()
        server.wait(30)


def _loop(conn_str: str, queue: str, n: int) -> dict[str, float]:
    """One round: n sends, then receive 32 + delete each until empty; messages a second."""
    from azure.storage.queue import QueueClient

    q = QueueClient.from_connection_string(conn_str, queue)
    q.create_queue()
    cpu = time.process_time()  # the SDK's own work: no server can answer faster than this
    began = time.perf_counter()
    for _ in range(n):
        q.send_message(BODY)
    sent = time.perf_counter()
    got = 0
    while True:
        page = list(q.receive_messages(messages_per_page=32, max_messages=32,
                                       visibility_timeout=60))
        if not page:
            break
        for m in page:
            q.delete_message(m)
        got += len(page)
    ended = time.perf_counter()
    client_ms = (time.process_time() - cpu) * 1000 / n
    assert got == n, f"received {got} of {n}"
    q.delete_queue()
    return {"loop": n / (ended - began), "send": n / (sent - began),
            "receive_delete": n / (ended - sent), "client_cpu_ms": client_ms}


def _conn_str(url: str, account: str, key: str) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={account};AccountKey={key};"
            f"QueueEndpoint={url}/{account};")


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """A ``queue-pg azure`` process of a bench run: its scratch database, account and key."""

    dsn: str
    machine: dict[str, Any]
    account: str
    key: str
    port: int
    process: subprocess.Popen[bytes]
    env: dict[str, str]

    @property
    def conn_str(self) -> str:
        return _conn_str(f"http://127.0.0.1:{self.port}", self.account, self.key)


def endpoint_process(stack: contextlib.ExitStack, args: argparse.Namespace,
                     account: str) -> Endpoint:
    """A scratch database (``--dsn``, ``--database``) with queue_pg, an account key of its
    user sealed with QUEUE_PG_SECRET_KEY (one made for the run if unset), and ``queue-pg
    azure`` serving it on a free port (authentication on); all undone by ``stack``."""
    from queue_pg import sealing

    env = os.environ.copy()
    env.setdefault(sealing.ENV, sealing.generate_key())
    ring = sealing.Keyring.required(env)
    dsn = stack.enter_context(db.scratch_database(args.dsn, args.database, keep=args.keep))
    db.install(dsn)
    with db.connect(dsn) as conn:
        machine = machine_info(conn)
        me = conn.execute("SELECT current_user").fetchone()
        assert me is not None
        account, key = sealing.create_azure_key(conn, str(me[0]), account, ring)
    port = _free_port()
    process = stack.enter_context(_listening(
        [sys.executable, "-c", "from queue_pg.ops.cli import main; main()", "--dsn", dsn,
         "azure", "--port", str(port)], port, env))
    return Endpoint(dsn, machine, account, key, port, process, env)


def run(args: argparse.Namespace) -> int:
    n = max(10, int(args.messages * args.scale))
    out = Path(args.out) if args.out else DEFAULT_OUT
    log: Callable[[str], None] = (lambda _: None) if args.quiet else print
    azurite: Path | str = ("n/a (--no-azurite)" if args.no_azurite
                           else azurite_bin(Path(args.azurite_dir), log))
    rounds: dict[str, list[dict[str, float]]] = {"endpoint": [], "endpoint_no_auth": [],
                                                  "azurite": []}
    with contextlib.ExitStack() as stack:
        ep = endpoint_process(stack, args, "benchacct")
        dsn, machine, account, key, env = ep.dsn, ep.machine, ep.account, ep.key, ep.env
        servers: dict[str, str] = {"endpoint": ep.conn_str}
        if args.with_no_auth:
            nport = _free_port()
            stack.enter_context(_listening(
                [sys.executable, "-c", "from queue_pg.ops.cli import main; main()", "--dsn", dsn,
                 "azure", "--no-auth", "--port", str(nport)], nport, env))
            servers["endpoint_no_auth"] = _conn_str(f"http://127.0.0.1:{nport}", account, key)
        if isinstance(azurite, Path):
            aport = _free_port()
            stack.enter_context(_listening(
                [str(azurite), "--queueHost", "127.0.0.1", "--queuePort", str(aport),
                 "--inMemoryPersistence", "--silent", "--skipApiVersionCheck",
                 "--disableTelemetry"], aport))
            servers["azurite"] = _conn_str(f"http://127.0.0.1:{aport}", EMULATOR_ACCOUNT,
                                           EMULATOR_KEY)
        for name, conn_str in servers.items():  # a warm-up round each, not counted
            _loop(conn_str, f"warm-{name.replace('_', '-')}", min(n, 50))
        order = list(servers)
        for i in range(args.rounds):
            for name in (order if i % 2 == 0 else order[::-1]):
                log(f"round {i + 1}: {name}, {n} messages...")
                rounds[name].append(_loop(servers[name], f"bench-{name.replace('_', '-')}-{i}", n))
    load_after = [round(x, 2) for x in os.getloadavg()]

    def median(name: str, k: str) -> float:
        return statistics.median(r[k] for r in rounds[name])

    phases = [("send + receive + delete (the loop)", "loop"), ("send, 1 a call", "send"),
              ("receive 32 + delete each", "receive_delete")]
    rows: list[list[Any]] = []
    for label, k in phases:
        a = median("endpoint", k)
        row = [label, f"{a:,.0f}"]
        if rounds["endpoint_no_auth"]:
            row.append(f"{median('endpoint_no_auth', k):,.0f}")
        if rounds["azurite"]:
            b = median("azurite", k)
            rows.append([*row, f"{b:,.0f}", f"{a / b:.1f}x"])
        else:
            rows.append([*row, str(azurite), "-"])
    if rounds["azurite"]:
        # the loop's bound: a server answering in no time still leaves the SDK's own CPU per
        # message, so endpoint / Azurite cannot pass Azurite's time per message over it
        client = median("endpoint", "client_cpu_ms")
        bound = 1000 / median("azurite", "loop") / client
        rows.append(["the SDK's own CPU per message of the loop, ms (bound: endpoint / Azurite"
                     " with a server taking no time)", f"{median('endpoint', 'client_cpu_ms'):.2f}",
                     *([f"{median('endpoint_no_auth', 'client_cpu_ms'):.2f}"]
                       if rounds["endpoint_no_auth"] else []),
                     f"{median('azurite', 'client_cpu_ms'):.2f}", f"≤ {bound:.1f}x"])
    heads = ["phase", "SDK → queue-pg azure",
             *(["same, --no-auth"] if rounds["endpoint_no_auth"] else []),
             f"SDK → Azurite {AZURITE}", "endpoint / Azurite"]
    markdown = "\n\n".join([
        "# Azure SDK loop: messages per second, queue-pg azure vs Azurite",
        f"`{args.command_line}` — {n} messages a round, {args.rounds} rounds each taking turns"
        f" (medians), one client thread; {machine_line(machine)}; load average after"
        f" {load_after[0]}",
        markdown_table(heads, rows, "l" + "r" * (len(heads) - 1)),
    ])
    data = {"scenario": "azure", "command": args.command_line, "dsn": redact_dsn(args.dsn),
            "machine": machine, "load_after": load_after, "messages": n, "rounds": rounds,
            "azurite": AZURITE if isinstance(azurite, Path) else azurite}
    for path in write_results(out, RESULT_NAME, data, markdown):
        log(f"wrote {path}")
    log(markdown)
    return 0


SCENARIO = Scenario(
    name="azure",
    help="the Azure SDK's send + receive + delete loop: queue-pg azure vs Azurite",
    add_arguments=add_arguments,
    run=run,
)
