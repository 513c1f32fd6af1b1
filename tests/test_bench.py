"""The benchmark suite runs end to end in smoke mode and writes what it promises.

Figures are never asserted (speed is measured in bench/, not in tests); these tests check that
every scenario runs against a real server, that queue_pg and the pgbench ceiling produce a rate
in each cell, that a peer that cannot do a cell says why, and that the JSON, Markdown, PNG and
summary files carry the expected keys. Peers run only when their packages are installed (the
``[bench]`` extra); CI installs ``[test]`` and smoke-tests queue_pg and the ceiling.
"""

from __future__ import annotations

import importlib.util
import json
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench import ceiling, db, peers
from bench.__main__ import main
from bench.runner import run_cell

pytestmark = pytest.mark.slow


def _db_name() -> str:
    return f"qpb_test_{uuid.uuid4().hex[:8]}"


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


@pytest.mark.timeout(300)  # every scenario; the worker one starts and stops its worker three times
def test_all_smoke_writes_every_result_and_the_summary(server_dsn: str, tmp_path: Path) -> None:
    name = _db_name()
    rc = main([
        "all", "--dsn", server_dsn, "--scale", "0.01", "--out", str(tmp_path), "--database",
        name, "--quiet", "--systems", "queue_pg", "--max-batch", "10", "--max-procs", "4",
    ])
    assert rc == 0
    for scenario in ("send", "cycle"):
        r = _load(tmp_path / f"{scenario}.json")
        assert {"machine", "parameters", "systems", "cells", "ceiling", "command"} <= set(r)
        assert r["machine"]["server_settings"]["autovacuum"] in ("on", "off")
        grid = [tuple(g) for g in r["parameters"]["grid"]]
        assert grid and all(b <= 10 and p <= 4 for b, p in grid)
        ours = {(c["batch"], c["procs"]): c for c in r["cells"] if c["system"] == "queue_pg"}
        assert set(ours) == set(grid)
        assert all(c["rate"] and c["rate"] > 0 and c["messages"] > 0 for c in ours.values())
        if ceiling.find_pgbench() is not None:
            ceil = {(c["batch"], c["procs"]): c for c in r["ceiling"]}
            assert set(ceil) == set(grid)
            assert all(c["rate"] and c["rate"] > 0 for c in ceil.values()), r["ceiling"]
        md = (tmp_path / f"{scenario}.md").read_text(encoding="utf-8")
        assert "queue_pg msg/s" in md and "Reproduce:" in md
    lat = _load(tmp_path / "latency.json")
    summary = lat["results"]["queue_pg"]["latency"]
    assert summary["n"] == lat["parameters"]["messages"]
    assert 0 < summary["p50_ms"] <= summary["p99_ms"] <= summary["max_ms"]
    wk = _load(tmp_path / "worker.json")
    ours = wk["results"]["queue_pg"]
    assert ours["latency"]["started"] == ours["latency"]["sent"]
    assert [(t["processes"], t["concurrency"]) for t in ours["throughput"]] == [(1, 16), (2, 8)]
    assert all(t["jobs_per_s"] > 0 and t["xact_per_job"] > 0 for t in ours["throughput"])
    # CPU per job from /proc: the workers' process groups and the local server's backends
    # (clock ticks: a short run may read 0; None only when every job ran before the first
    # sample, and then for both)
    for t in ours["throughput"]:
        w, s = t["worker_cpu_us_per_job"], t["server_cpu_us_per_job"]
        assert (w is None and s is None) or (w >= 0 and s >= 0), t
    wcpu = _load(tmp_path / "worker_cpu.json")
    assert [r["concurrency"] for r in wcpu["results"]] == [16, 8]
    assert all(r["cpu_us_per_job"] > 0 and r["jobs_per_s"] > 0 for r in wcpu["results"])
    assert "ratios_leased_over_empty" in _load(tmp_path / "leased_head.json")
    cpu = _load(tmp_path / "client_cpu.json")
    assert [r["batch"] for r in cpu["results"]] == [1, 10, 100]
    assert all(r[v]["cpu_us"] > 0 for r in cpu["results"] for v in ("psycopg", "queue_pg"))
    text = (tmp_path / "summary.md").read_text(encoding="utf-8")
    for row in ("send msg/s", "cycle msg/s", "latency, send → receive", "worker jobs/s",
                "leased head", "client CPU µs per receive", "autovacuum"):
        assert row in text
    if importlib.util.find_spec("matplotlib") is not None:
        for scenario in ("send", "cycle", "latency"):
            assert (tmp_path / f"{scenario}.png").read_bytes()[:4] == b"\x89PNG"
    # every scratch database is gone
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s", [name + "%"]
        ).fetchall()
    assert left == []


def test_ceiling_scripts_are_the_clients_statements() -> None:
    from queue_pg import _ops

    send, defines = ceiling.script_for("send", 10)
    query = str(_ops.send_batch(peers.QUEUE, [{}]).query)
    assert query.split("(")[0] in send  # "select s.id from queue_pg.send_batch"
    assert defines["bodies"].count('"payload"') == 10  # one jsonb array of 10 bodies
    cycle, _ = ceiling.script_for("cycle", 10)
    assert "queue_pg._receive(:queue, :max_messages::int" in cycle
    assert "delete_batch" not in cycle and "\\gset" in cycle  # receive(delete=...) carries receipts


@pytest.mark.parametrize("system", [s for s in peers.SYSTEMS if s != "queue_pg"])
def test_peer_sends_and_cycles(system: str, server_dsn: str) -> None:
    ok, missing = peers.installed_systems([system])
    if not ok:
        pytest.skip(missing[system])
    driver = peers.get(system)
    with db.scratch_database(server_dsn, _db_name()) as dsn:
        info = driver.install(dsn)
        assert info
        sent = run_cell(system, dsn, "send", 10, 2, 0.3)
        assert sent.rate and sent.messages >= 20, sent.note
        with db.connect(dsn) as conn:
            assert driver.depth(conn) >= sent.messages
            driver.purge(conn)
            assert driver.depth(conn) == 0
        for batch in (1, 10):
            if driver.unsupported("cycle", batch):
                continue  # the tables print "n/a (why)" without running it
            # each cycle gets its own backlog: a fast batch-1 cycle may drain 500 in 0.3 s
            driver.fill(dsn, 500, start=batch * 1_000)
            cell = run_cell(system, dsn, "cycle", batch, 2, 0.3)
            assert cell.rate and cell.messages > 0, cell.note
            with db.connect(dsn) as conn:
                assert driver.depth(conn) <= 500 - cell.messages
                driver.purge(conn)
        if driver.unsupported("latency", 1) is None:
            from bench.latency import measure

            r = measure(system, dsn, rate=50, count=10)
            assert r.get("received") == 10, r


def test_cycle_cpu_measures_every_idiom_in_turns(server_dsn: str, tmp_path: Path) -> None:
    """The server-CPU scenario measures both idioms, the floor (and PGMQ when installed), each
    round a figure, from the backend's /proc time; the A/B baseline is measured beside them."""
    with db.scratch_database(server_dsn, _db_name()) as baseline:
        db.install(baseline)
        rc = main(["cycle-cpu", "--dsn", server_dsn, "--database", _db_name(), "--out",
                   str(tmp_path), "--quiet", "--rounds", "2", "--cycles", "3", "--batches", "10",
                   "--baseline", baseline])
    assert rc == 0
    r = _load(tmp_path / "cycle_cpu.json")
    [row] = r["results"]
    expected = {"plain", "combined", "baseline plain", "baseline combined", "floor"}
    if importlib.util.find_spec("pgmq") is not None:
        expected.add("PGMQ")
    assert set(row["cpu_us"]) == expected
    assert all(len(v) == 2 and all(x > 0 for x in v) for v in row["rounds"].values())
    assert "Reproduce:" in (tmp_path / "cycle_cpu.md").read_text(encoding="utf-8")


@pytest.mark.timeout(600)  # three servers, each a boto3 loop and a Celery worker's start
def test_sqs_runs_the_endpoint_the_floor_and_moto_in_turns(server_dsn: str,
                                                           tmp_path: Path) -> None:
    """The SQS scenario measures the endpoint, the floor (bench/sqs_floor.py) and moto's server
    in turns, the boto3 loop and, when Celery's transport is installed, Celery on each."""
    pytest.importorskip("boto3")
    rc = main(["sqs", "--dsn", server_dsn, "--database", _db_name(), "--out", str(tmp_path),
               "--quiet", "--rounds", "1", "--messages", "30", "--tasks", "10"])
    assert rc == 0
    r = _load(tmp_path / "sqs.json")
    expected = {"endpoint", "floor"}
    if importlib.util.find_spec("moto.server") is not None:
        expected.add("moto")
    assert {k for k, v in r["loop"].items() if v} == expected
    assert all(x > 0 for k in expected for x in r["loop"][k])
    if importlib.util.find_spec("celery") and importlib.util.find_spec("pycurl"):
        assert {k for k, v in r["celery"].items() if v} == expected
    assert "floor / moto" in (tmp_path / "sqs.md").read_text(encoding="utf-8")


def test_tuning_quick_runs_every_message_to_the_end(server_dsn: str, tmp_path: Path) -> None:
    status = main(["tuning", "--dsn", server_dsn, "--quick", "--quiet", "--out", str(tmp_path),
                   "--database", _db_name()])
    assert status == 0
    data = _load(tmp_path / "tuning.json")
    rows = {r["setup"]: r for r in data["rows"]}
    assert set(rows) == {"sqs-default", "per-type"}
    for r in rows.values():
        assert r["messages"] == data["workload"]["messages"] and r["throughput_per_s"] > 0
        assert r["crashes"] > 0 and r["recovery_mean_s"] is not None
    assert "| per-type |" in (tmp_path / "tuning.md").read_text(encoding="utf-8")


@pytest.mark.spark
@pytest.mark.timeout(900)  # a JVM and two rounds of five methods; minutes on a busy host
def test_spark_smoke_enqueues_and_advises(server_dsn: str, tmp_path: Path) -> None:
    pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'queue-pg[spark]'")
    rc = main(["spark", "--dsn", server_dsn, "--rows", "3000", "--history-rows", "3000",
               "--rounds", "2", "--out", str(tmp_path), "--database", _db_name(), "--quiet"])
    assert rc == 0
    data = _load(tmp_path / "spark.json")
    assert set(data["results"]) == {"enqueue", "raw_copy", "jdbc", "jdbc_like", "send_batch",
                                    "advisor_spark", "advisor_sql"}
    assert data["results"]["enqueue"]["rows"] == 3000
    assert len(data["results"]["raw_copy"]["runs"]) == 2 and len(data["enqueue_vs_raw_copy"]) == 2
    assert data["results"]["advisor_sql"]["same_advice"] is True
    md = (tmp_path / "spark.md").read_text()
    assert "queue_pg.spark.enqueue" in md and "sink ÷ raw COPY into queue_pg.messages" in md


@pytest.mark.parametrize("system", ["pgqueuer", "procrastinate", "celery", "rq"])
def test_worker_peer_runs_its_own_worker_entry_point(
    system: str, server_dsn: str, tmp_path: Path
) -> None:
    from bench.worker_systems import DEFAULT_REDIS, SYSTEMS

    cls = next(s for s in SYSTEMS if s.name == system)
    missing = cls.missing(DEFAULT_REDIS)
    if missing:
        pytest.skip(f"n/a ({missing})")
    pytest.importorskip(cls.distribution)
    rc = main(["worker", "--dsn", server_dsn, "--systems", system, "--jobs", "1000",
               "--scale", "0.1", "--latency-jobs", "50", "--out", str(tmp_path),
               "--database", _db_name(), "--quiet"])
    assert rc == 0
    r = _load(tmp_path / "worker.json")["results"][system]
    assert r["latency"]["started"] == r["latency"]["sent"]
    assert all(t["jobs"] >= 20 and t["jobs_per_s"] > 0 for t in r["throughput"])
    assert all(("xact_per_job" in t) == cls.postgres for t in r["throughput"])
    assert cls.label in (tmp_path / "worker.md").read_text(encoding="utf-8")


def test_bloat_soak_records_sizes_load_and_cpu_per_message(server_dsn: str, tmp_path: Path) -> None:
    rc = main(["soak", "--dsn", server_dsn, "--minutes", "0.2", "--sample", "3", "--backlog",
               "200", "--out", str(tmp_path), "--database", _db_name(), "--quiet",
               "--chart", str(tmp_path / "soak.png")])
    assert rc == 0
    data = _load(tmp_path / "soak.json")
    samples = data["samples"]
    assert len(samples) >= 3
    for s in samples:
        assert s["load1"] >= 0 and set(s["groups"]) == {"messages", "history", "counters"}
        assert s["groups"]["messages"]["bytes"] > 0
    done = [s for s in samples if s["messages"] > 0]
    assert done and all(s["cpu_ms_per_1000"] > 0 for s in done)  # the load's CPU was seen
    summary = data["summary"]
    assert summary["messages_processed"] == samples[-1]["deleted"] > 0
    assert summary["cpu_ms_per_1000_start"] > 0 and summary["load_start"] >= 0
    assert "| figure | value |" in (tmp_path / "soak.md").read_text(encoding="utf-8")
    assert (tmp_path / "soak.png").stat().st_size > 0
