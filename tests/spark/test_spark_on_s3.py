"""Spark itself on S3 (issue 43): a registered query whose checkpoint is ``s3://`` runs with
Spark writing ``s3a://`` to the embedded endpoint (SeaweedFS), and leaves the state and output
the same query leaves on a local checkpoint, for the same input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stateops.core.checkpoint import load_checkpoint
from stateops.core.registry import load_registry
from stateops.spark.export import state_checksum, state_reads
from stateops.spark.streaming import checkpoint_url
from tests.conftest import spark_submit_run_query, write_registry
from tests.spark.harness import land, quiesce, read_sink, run_in_session

pytestmark = pytest.mark.spark
NAME = "page_visits"


def state_of(spark, checkpoint: str) -> dict[str, tuple]:
    """Rows and checksum of every state variable at the last committed batch."""
    batch = load_checkpoint(checkpoint).last_committed_batch
    out = {}
    for read in state_reads(spark, checkpoint, batch):
        frame = (
            spark.read.format("statestore")
            .options(batchId=str(batch), operatorId=str(read["operator_id"]), **read["options"])
            .load(checkpoint_url(spark, checkpoint))
        )
        out[json.dumps(read["options"], sort_keys=True)] = state_checksum(frame)
    quiesce(spark)
    return out


def test_a_query_on_an_s3_checkpoint_equals_the_same_query_on_a_local_one(spark, s3a_env, tmp_path):
    url = s3a_env.url(f"{tmp_path.name}/{NAME}")
    registries = {
        "local": write_registry(tmp_path / "local"),
        "s3": write_registry(tmp_path / "s3", **{NAME: {"checkpoint": url}}),
    }
    results = {}
    for where, registry in registries.items():
        for round_ in (0, 1):
            land(Path(registry).parent / "landing", round_=round_, files=2)
            run_in_session(spark, registry, NAME, "--mode", "available-now")
        query = load_registry(registry).query(NAME)
        results[where] = (
            load_checkpoint(query.checkpoint).last_committed_batch,
            state_of(spark, query.checkpoint),
            read_sink(Path(query.sink.path)),
        )
    assert results["s3"] == results["local"] and results["s3"][1]


def test_spark_submit_runs_a_query_on_an_s3_checkpoint(s3a_env, tmp_path):
    url = s3a_env.url(f"{tmp_path.name}/{NAME}")
    registry = write_registry(tmp_path, **{NAME: {"checkpoint": url}})
    land(tmp_path / "landing", round_=0, files=2)
    proc = spark_submit_run_query(registry, NAME, "--mode", "available-now")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert load_checkpoint(url).last_committed_batch == 1  # a batch per landed file
