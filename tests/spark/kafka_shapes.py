"""Queries of three shapes reading the embedded broker (tests/spark/test_kafka_shapes.py): the
registry's ``page_visits`` processor (transformWithStateInPandas) and ``page_counts`` windowed
aggregation (HDFS-backed store), each on a topic, and a stream-stream join of a topic with a
folder (``shapes:views_near_events``); their records, and runs that keep Spark's progress."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import yaml

from stateops.core.registry import load_registry
from stateops.spark.streaming import apply_query_conf, start_query, use_code_paths
from tests.conftest import TEST_SPARK_CONF, TEST_STATE_STORE, write_registry
from tests.spark.harness import EVENTS, USER_CODE, _registered_conf, run_to_end

T0 = 1_790_000_000  # epoch s of the first event (in the past: brokers refuse the future)
STEP = 20  # s between events: 40 events span more than one 10-minute window and watermark
VIEWS_SCHEMA = "user_id STRING, page STRING, event_time TIMESTAMP"
PER_TRIGGER = 10  # records per batch: several batches from one round

# name -> what the query is, by the registry's entry it takes (or a transform of the shapes).
SHAPES = {
    "kafka_visits": "page_visits",  # transformWithStateInPandas, RocksDB
    "kafka_counts": "page_counts",  # windowed aggregation, HDFS-backed store
    "kafka_join": "views_near_events",  # a topic joined with a folder, RocksDB
}


def visits(start: int, n: int) -> list[tuple[str, dict, int]]:
    """``n`` page visits of 5 users from event ``start`` on, one every STEP s, each keyed by
    its user (so each user's visits keep their order in one partition)."""
    out = []
    for i in range(start, start + n):
        user, stamp = f"u{i % 5}", T0 + i * STEP
        out.append(
            (user, {"user_id": user, "page": f"/p{i % 7}", "event_time": stamp}, stamp * 1000)
        )
    return out


_mtime = [1_700_000_000]


def land_events(folder: Path, start: int, n: int, name: str) -> None:
    """A JSON file of the users' events near visits ``start``..``start + n`` (10 s after each),
    its mtime after every earlier one's (the file source reads in mtime order, one a batch)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps(
            {
                "user_id": f"u{i % 5}",
                "data": f"e{i}",
                "is_last": False,
                "event_time": T0 + i * STEP + 10,
            }
        )
        for i in range(start, start + n)
    ]
    path = folder / f"{name}.json"
    path.write_text("\n".join(lines) + "\n")
    _mtime[0] += 10
    os.utime(path, (_mtime[0], _mtime[0]))


def kafka_source(topic: str) -> dict:
    return {
        "format": "kafka",
        "topic": topic,
        "schema": VIEWS_SCHEMA,
        "options": {"startingOffsets": "earliest", "maxOffsetsPerTrigger": PER_TRIGGER},
    }


def kafka_registry(
    root: Path, topic: str, events: Path, *, partitions: int = 2, **state_store: object
) -> Path:
    """The shapes above on ``topic`` (the join's folder: ``events``), test-sized, with
    ``partitions`` state partitions, ``state_store`` settings on RocksDB, backed up to the
    test's S3 under ``root``'s name."""
    path = write_registry(root)
    raw = yaml.safe_load(path.read_text())
    queries = raw["queries"]
    for name, shape in SHAPES.items():
        if shape == "views_near_events":
            entry = {
                "sources": {
                    "views": kafka_source(topic),
                    "events": {**copy.deepcopy(EVENTS), "path": str(events)},
                },
                "transform": {"function": "shapes:views_near_events", "output_mode": "append"},
                "state_store": {"provider": "rocksdb"},
            }
        else:
            entry = copy.deepcopy(queries[shape])
            entry["source"] = kafka_source(topic)
        queries[name] = {
            **entry,
            "shuffle_partitions": partitions,
            "spark_conf": dict(TEST_SPARK_CONF),
            "state_store": {
                **entry["state_store"],
                **TEST_STATE_STORE,
                **(state_store if entry["state_store"]["provider"] == "rocksdb" else {}),
            },
            "sink": {"format": "parquet", "path": f"output/{name}"},
            "checkpoint": f"checkpoints/{name}",
        }
    raw["code_paths"] = [str(USER_CODE)]
    raw["backups"]["url"] = f"s3://backups/{root.parent.name}-{root.name}"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def run_with_progress(spark, registry: Path, name: str, timeout: float = 240) -> list[dict]:
    """Run registered query ``name`` available-now in the shared session, as run_query.py
    starts it (:func:`stateops.spark.streaming.start_query`); Spark's own progress events of
    the run (``StreamingQueryProgress`` as JSON)."""
    reg = load_registry(registry)
    query = reg.query(name)
    use_code_paths(reg, spark)
    _registered_conf(spark)
    apply_query_conf(spark, query)
    progress = run_to_end(
        spark, lambda: start_query(spark, query, available_now=True), name, timeout
    )
    return [json.loads(p.json) if hasattr(p, "json") else dict(p) for p in progress]
