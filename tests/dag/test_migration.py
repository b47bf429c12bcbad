"""stream_source_migration through ``airflow dags test`` on local Spark and the embedded S3
(tests/e2e/test_standalone_migration.py triggers it through the REST API of a real
``airflow standalone``, with user_sessions).

One event stream split at a cutover: round 0 lands as JSON in the old source, round 1 as
Parquet in a new folder. After the migration and the rest of the new source, the state and
the output must equal one uninterrupted query's over every event.
"""

from __future__ import annotations

import json
import os
import stat
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq
import pytest
import yaml

from stateops.audit import audit_dir
from stateops.backup import list_backups
from stateops.checkpoint import load_checkpoint
from stateops.registry import load_registry
from tests.conftest import S3_KEY, S3_SECRET, spark_submit_run_query, tree_digest, write_registry
from tests.dag.test_stream_start_run import _airflow
from tests.spark.harness import land, read_sink, read_state

pytestmark = pytest.mark.dag

READS = {
    "user_sessions": [{"stateVarName": "events"}, {"readRegisteredTimers": "true"}],
    "page_visits": [{"stateVarName": "pages"}, {"stateVarName": "count"}],
}
ARROW = {"STRING": pa.string(), "BOOLEAN": pa.bool_(), "TIMESTAMP": pa.timestamp("us", "UTC")}
FILES = 3  # per round; one file per batch (maxFilesPerTrigger: 1)


def _ok(proc) -> None:
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]


def _as_parquet(json_files: list[Path], folder: Path, ddl: str) -> None:
    """The same events in Parquet, one file per JSON file, with the same modification times."""
    from stateops.registry import schema_fields

    schema = pa.schema([(name, ARROW[kind]) for name, kind in schema_fields(ddl)])
    folder.mkdir(parents=True)
    for f in json_files:
        table = pj.read_json(f, parse_options=pj.ParseOptions(explicit_schema=schema))
        target = folder / (f.stem + ".parquet")
        pq.write_table(table, target)
        os.utime(target, (f.stat().st_mtime, f.stat().st_mtime))


class Migration:
    """A data folder with the old query run on part of round 0 (the rest is left to the drain)
    and round 1 as Parquet in the new source's folder."""

    def __init__(self, tmp_path: Path, name: str, s3) -> None:
        self.root, self.name = tmp_path, name
        self.path = write_registry(tmp_path)
        raw = yaml.safe_load(self.path.read_text())
        raw["backups"] = {"url": f"s3://backups/{tmp_path.name}", "conn_id": "aws_default"}
        self.path.write_text(yaml.safe_dump(raw, sort_keys=False))
        conn = {"conn_type": "aws", "login": S3_KEY, "password": S3_SECRET,
                "extra": {"endpoint_url": s3.endpoint}}  # fmt: skip
        self.env = {"AIRFLOW_CONN_AWS_DEFAULT": json.dumps(conn)}
        self.s3 = s3
        query = self.query
        land(tmp_path / "landing", round_=0, files=FILES)
        landing = Path(query.source.path)
        last = sorted(landing.iterdir())[-1]
        held_back = tmp_path / last.name
        os.replace(last, held_back)  # arrives after the first run: the drain reads it
        _ok(spark_submit_run_query(self.path, name))
        os.replace(held_back, last)
        land(tmp_path / "round1", round_=1, files=FILES)
        _as_parquet(sorted((tmp_path / "round1" / name).iterdir()),
                    tmp_path / "landing_v2" / name, query.source.schema_)  # fmt: skip
        _ok(_airflow(tmp_path, "db", "migrate"))

    @property
    def query(self):
        return load_registry(self.path).query(self.name)

    def conf(self, **extra) -> dict:
        return {
            "query": self.name,
            "new_source_format": "parquet",
            "new_source_path": f"landing_v2/{self.name}",
            "new_source_options": {"maxFilesPerTrigger": 1},
            "dry_run": False,
            **extra,
        }

    def trigger(self, conf: dict, **env: str):
        run = _airflow(self.root, "dags", "test", "stream_source_migration", "--conf",
                       json.dumps(conf), env={**self.env, **env})  # fmt: skip
        return run, run.stdout + run.stderr


def _uninterrupted(tmp_path: Path, name: str):
    whole = write_registry(tmp_path / "whole")
    land(tmp_path / "whole" / "landing", round_=0, files=FILES)
    land(tmp_path / "whole" / "landing", round_=1, files=FILES)
    _ok(spark_submit_run_query(whole, name))
    return load_registry(whole).query(name)


def _rows(sink: Path) -> Counter:
    return Counter(row for rows in read_sink(sink).values() for row in rows)


def _assert_migrated(spark, m: Migration, whole, run_log: str) -> None:
    query = m.query
    old_checkpoint = str(m.root / "checkpoints" / m.name)
    assert query.source.format == "parquet" and query.checkpoint == old_checkpoint + ".v2"
    assert f"{m.name}: switched to" in run_log and "carry-over proven" in run_log
    lineage = json.loads((audit_dir(query.checkpoint) / "lineage.json").read_text())
    old = load_checkpoint(old_checkpoint)
    assert lineage["from"]["last_committed_batch"] == old.last_committed_batch
    assert lineage["from"]["query_id"] == old.query_id
    backups = list_backups(f"s3://backups/{m.root.name}/{m.name}", m.s3.client())
    assert lineage["backup_id"] in [b["backup_id"] for b in backups]
    assert all(
        not p.stat().st_mode & stat.S_IWUSR for p in Path(old_checkpoint).rglob("*") if p.is_file()
    ), "the old checkpoint is kept read-only"
    assert query.sink.batch_offset == query.sink.folder_batch(0) > old.last_committed_batch

    _ok(spark_submit_run_query(m.path, m.name))  # the rest of the new source, after the switch
    query = m.query
    assert load_checkpoint(query.checkpoint).last_committed_batch >= FILES - 1
    assert read_state(spark, query.checkpoint, READS[m.name]) == read_state(
        spark, whole.checkpoint, READS[m.name]
    ), "state differs from the uninterrupted run's"
    assert _rows(Path(query.sink.path)) == _rows(Path(whole.sink.path))


# Every step after preflight; CI injects a failure after the first Spark step, the bootstrap
# and the switch (each failed run costs the steps before it). STATEOPS_ALL_FAULTS=1: every step.
STEPS = ["stop_query", "drain", "backup", "export", "validate_export", "bootstrap", "prove",
         "validate_new_state", "switch"]  # fmt: skip
FAULTS = STEPS if os.environ.get("STATEOPS_ALL_FAULTS") else ["drain", "bootstrap", "switch"]


def test_page_visits_failure_at_each_step_rolls_back_then_a_new_trigger_migrates(
    spark, s3, tmp_path
):
    from stateops.lock import read_hold

    whole = _uninterrupted(tmp_path, "page_visits")
    m = Migration(tmp_path, "page_visits", s3)
    old = Path(m.query.checkpoint)
    lock = load_registry(m.path).lock_path("page_visits")
    before = tree_digest(m.root / "checkpoints")
    dry, log = m.trigger(m.conf(dry_run=True))
    assert dry.returncode == 0, log[-5000:]
    assert "DRY RUN: would migrate page_visits" in log
    assert tree_digest(m.root / "checkpoints") == before and read_hold(lock) is None
    drained = None
    for step in FAULTS:
        run, log = m.trigger(m.conf(), STATEOPS_FAIL_AFTER=step)
        assert run.returncode != 0, log[-3000:]
        assert f"injected failure after {step}" in log
        assert "migration rolled back; the query runs on" in log, log[-5000:]
        query = m.query
        assert (query.source.format, query.checkpoint, query.sink.batch_offset) == (
            "json",
            str(old),
            0,
        ), f"after a failure at {step}, the registry still points at the old source"
        assert read_hold(lock) is None, "the hold is released"
        assert not Path(f"{old}.v2").exists(), "the new checkpoint is moved aside"
        assert all(p.stat().st_mode & stat.S_IWUSR for p in old.rglob("*") if p.is_file())
        folders = {int(f.name.split("=")[1]) for f in Path(query.sink.path).glob("batch_id=*")}
        assert max(folders) == load_checkpoint(old).last_committed_batch, (
            f"after a failure at {step}, the new checkpoint's output is moved aside"
        )
        digest = tree_digest(old)
        if step != "stop_query":  # the drain ran: from then on, the old checkpoint is fixed
            drained = drained or digest
            assert digest == drained, f"a failure at {step} changed the old checkpoint"
    assert len(list(tmp_path.glob("checkpoints/page_visits.v2.failed-*"))) >= 2  # kept aside

    # The old query is still runnable: nothing new to read, so no batch and no change.
    _ok(spark_submit_run_query(m.path, "page_visits"))
    assert tree_digest(old) == drained

    run, log = m.trigger(m.conf())
    assert run.returncode == 0, log[-8000:]
    _assert_migrated(spark, m, whole, log)
