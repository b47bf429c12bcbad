"""A Delta-to-Delta stateful query (issue 76): page_visits reads a Delta table Spark wrote, one
version a batch, and writes a Delta table. Its lag is exact in the source table's versions, as
Delta's own history counts them; once VACUUM deleted the files of versions the query would
read again, a rollback is refused in one line with the checkpoint and both tables
byte-identical, and the status says what is lost."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from stateops.core.checkpoint import load_checkpoint
from stateops.core.registry import load_registry
from stateops.status import query_status
from tests.conftest import run_cli, tree_digest, write_registry
from tests.spark.harness import read_state, run_in_session
from tests.spark.test_delta_sink import commits
from tests.spark.test_kafka_rollback import READS

pytestmark = [pytest.mark.spark, pytest.mark.whole]

T0 = datetime(2026, 1, 5, 9, tzinfo=UTC)
SCHEMA = "user_id STRING, page STRING, event_time TIMESTAMP"


def append_version(spark, table, start: int, n: int = 5) -> None:
    """``n`` visits of 5 users, one a second from T0 + ``start`` s, as one Delta commit of one
    file (Spark's own writer)."""
    rows = [(f"u{i % 5}", f"/p{i % 7}", T0 + timedelta(seconds=i)) for i in range(start, start + n)]
    df = spark.createDataFrame(rows, SCHEMA).coalesce(1)
    df.write.format("delta").mode("append").save(str(table))


def part(path) -> dict:
    [found] = query_status(load_registry(path), "page_visits")["positions"]
    return found


def test_the_lag_is_exact_in_versions_and_a_rollback_past_a_vacuumed_version_is_refused(
    spark, tmp_path
):
    source, sink = tmp_path / "tables" / "events", tmp_path / "tables" / "visits"
    for v in range(4):
        append_version(spark, source, start=5 * v)
    registry = write_registry(
        tmp_path,
        page_visits={
            "source": {
                "format": "delta",
                "path": str(source),
                "schema": SCHEMA,
                # its changes version by version (without startingVersion Delta reads a
                # snapshot of the table first)
                "options": {"startingVersion": 0, "maxFilesPerTrigger": 1},
            },
            "sink": {"format": "delta", "path": str(sink)},
        },
    )
    summary = run_in_session(spark, registry, "page_visits", "--mode", "available-now")
    assert summary["status"] == "succeeded" and summary["input_rows"] == 20, summary
    checkpoint = tmp_path / "checkpoints" / "page_visits"
    cp = load_checkpoint(checkpoint)
    assert cp.last_committed_batch == 3, "one version a batch"
    assert read_state(spark, str(checkpoint), READS), "the query kept state"

    latest = max(c["version"] for c in commits(spark, source))  # Delta's own history
    caught_up = part(registry)
    assert (caught_up["kind"], caught_up["lag_total"], caught_up["lag_unit"]) == (
        "delta",
        0,
        "versions",
    )
    assert (caught_up["next_version"], caught_up["latest_version"]) == (latest + 1, latest)
    for v in (4, 5):
        append_version(spark, source, start=5 * v)
    behind = part(registry)
    assert behind["lag_total"] == 2 == max(c["version"] for c in commits(spark, source)) - latest
    assert behind["said"] == f"lag 2 versions (next version {latest + 1}, latest {latest + 2})"

    # Another writer overwrites the table and VACUUM deletes every file the log no longer
    # lists: versions 0 to 5's.
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        spark.createDataFrame([("u9", "/x", T0)], SCHEMA).write.format("delta").mode(
            "overwrite"
        ).save(str(source))
        spark.sql(f"VACUUM delta.`{source}` RETAIN 0 HOURS")
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    before = tree_digest(tmp_path)
    refused = run_cli("--registry", str(registry), "rollback", "page_visits", "--to-batch", "0")
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    said = refused.stderr
    assert f"table {source} no longer holds what the query would read again" in said, said
    assert "the data files of versions 1 on were vacuumed" in said, said
    assert tree_digest(tmp_path) == before, "the checkpoint and both tables as they were"
    lost = part(registry)["lost"]
    assert lost and "vacuumed" in lost[0], lost
    [status] = json.loads(
        run_cli("--registry", str(registry), "status", "page_visits", "--json").stdout
    )
    rules = {f["rule"]: f["level"] for f in status["health"]["findings"]}
    assert rules["retention_passed"] == "FAIL", status["health"]
