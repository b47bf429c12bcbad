"""A data folder whose queries ran their old code, and copies of it with new code in a
registry entry, for the code upgrade's tests: the library's (tests/spark/test_upgrade.py) and
``airflow dags test stream_code_upgrade``'s (tests/dag/test_code_upgrade.py). The old
checkpoints are written once per module by Spark; each test upgrades a copy of them."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from tests.conftest import TEST_SPARK_CONF, TEST_STATE_STORE, write_registry
from tests.spark.harness import USER_CODE, VIEWS, land, repoint, run_in_session

NAME = "page_visits"
# page_visits' new code: views per user and page (a wider key, new variables), the old state
# mapped into it by the registry's initial_state.mapping (the demo's upgrade too).
PER_PAGE = {
    "processor": {
        "class": "stateops.pipelines.page_views:PageViewsProcessor",
        "options": {},
        "time_mode": "None",
        "output_mode": "Update",
    },
    "key_columns": ["user_id", "page"],
    "output_schema": "user_id STRING, page STRING, views LONG",
    "initial_state": {
        "schema": "user_id STRING, page STRING, views LONG",
        "unique_keys": True,
        "mapping": "stateops.pipelines.page_views:views_from_page_visits",
    },
    "expectations": {},
}
# The old code of a dedup, beside registry.yaml's queries: Spark's dropDuplicates per user and
# page.
PAGE_PAIRS = {
    "source": VIEWS,
    "transform": {"function": "upgrades:dedup_pairs", "output_mode": "append"},
    "key_columns": ["user_id", "page"],
    "sink": {"format": "parquet", "path": "output/page_pairs"},
    "checkpoint": "checkpoints/page_pairs",
    "state_store": {**TEST_STATE_STORE, "provider": "rocksdb"},
    "shuffle_partitions": 2,
}


def upgrade_registry(root: Path, encoding: str, query: str = NAME, **entry) -> Path:
    """``root``'s registry: registry.yaml's queries and page_pairs, test-sized, ``entry`` as
    ``query``'s code on RocksDB with ``encoding``, the user code of tests/spark/user_code,
    backups to ``s3://backups/<root's name>`` (through the connection aws_default); no
    approval."""
    path = write_registry(root)
    raw = yaml.safe_load(path.read_text())
    raw["queries"]["page_pairs"] = {**PAGE_PAIRS, "spark_conf": dict(TEST_SPARK_CONF)}
    spec = raw["queries"][query]
    spec.update({"approval": "none", **entry})
    spec["state_store"] = {**spec["state_store"], "provider": "rocksdb", "encoding": encoding}
    raw["code_paths"] = [str(USER_CODE)]
    raw["backups"] = {"url": f"s3://backups/{root.name}", "conn_id": "aws_default"}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def run_old_code(
    spark, root: Path, encoding: str, queries: tuple[str, ...] = (NAME,), **entry
) -> Path:
    """A data folder whose ``queries`` ran their old code (page_visits' as ``entry``) over 2
    files of round 0."""
    land(root / "landing", round_=0, files=2)
    path = upgrade_registry(root, encoding, **entry)
    for name in queries:
        run_in_session(spark, path, name)
    return root


def with_new_code(old: Path, root: Path, encoding: str, query: str = NAME, **entry) -> Path:
    """A copy of ``old``'s data folder (checkpoints, landing, output) with the new code of
    ``query``; returns its registry. The copied checkpoints name their own files (their
    source logs and transformWithState's metadata name files by absolute path)."""
    shutil.copytree(old, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns("registry.yaml"))
    for checkpoint in (root / "checkpoints").iterdir():
        if checkpoint.suffix != ".audit" and (checkpoint / "metadata").exists():
            repoint(checkpoint, old, root)
    return upgrade_registry(root, encoding, query, **entry)
