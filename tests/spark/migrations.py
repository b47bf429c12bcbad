"""A source migration to run and judge, for the migration's tests at every level: the library
(tests/spark/test_migration_run.py), ``airflow dags test`` (tests/dag/test_migration.py) and
the REST API of a real ``make airflow`` stack (tests/e2e/test_airflow.py).

One event stream split at a cutover: round 0 lands as JSON in the old source, round 1 as
Parquet in a new folder. After the migration and the rest of the new source, the state and
the output must equal one uninterrupted query's over every event, by either road the state
takes (a transplant of the old state files, or export + bootstrap with ``initialState``).
Either checkpoint may be in S3 (tests/spark/test_migration_s3.py): the old one as the
registry entry's ``checkpoint``, the new one as the plan's.
"""

from __future__ import annotations

import json
import os
import random
import re
import stat
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq
import yaml

from stateops.control.audit import audit_dir
from stateops.control.markers import read_retired
from stateops.core.checkpoint import load_checkpoint
from stateops.core.registry import load_registry
from stateops.core.staging import occupied
from stateops.core.storage import S3Path, location
from stateops.ops.backup import list_backups
from tests.conftest import S3_KEY, S3_SECRET, write_registry
from tests.spark.harness import (
    digest,
    land,
    read_sink,
    read_state,
    run_in_session,
    spark_state_reads,
)

READS = {
    "user_sessions": [{"stateVarName": "events"}, {"readRegisteredTimers": "true"}],
    "page_visits": [{"stateVarName": "pages"}, {"stateVarName": "count"}],
}
ARROW = {"STRING": pa.string(), "BOOLEAN": pa.bool_(), "TIMESTAMP": pa.timestamp("us", "UTC")}
FILES = 3  # per round; one file per batch (maxFilesPerTrigger: 1)


def as_parquet(json_files: list[Path], folder: Path, ddl: str) -> None:
    """The same events in Parquet, one file per JSON file, with the same modification times."""
    from stateops.core.registry import schema_fields

    schema = pa.schema([(name, ARROW[kind]) for name, kind in schema_fields(ddl)])
    folder.mkdir(parents=True)
    for f in json_files:
        table = pj.read_json(f, parse_options=pj.ParseOptions(explicit_schema=schema))
        target = folder / (f.stem + ".parquet")
        pq.write_table(table, target)
        os.utime(target, (f.stat().st_mtime, f.stat().st_mtime))


class Migration:
    """A data folder with the old query run on part of round 0 (the rest is left to the drain)
    and round 1 as Parquet in the new source's folder, for query ``name``."""

    def __init__(
        self,
        spark,
        tmp_path: Path,
        name: str,
        s3,
        approval: str = "none",
        code_paths: tuple[Path, ...] = (),
        **entry,
    ) -> None:
        self.root, self.name = tmp_path, name
        self.path = write_registry(tmp_path, **{name: {"approval": approval, **entry}})
        self.edit_registry(
            backups={"url": f"s3://backups/{tmp_path.name}", "conn_id": "aws_default"},
            code_paths=[str(p) for p in code_paths],
        )
        conn = {
            "conn_type": "aws",
            "login": S3_KEY,
            "password": S3_SECRET,
            "extra": {"endpoint_url": s3.endpoint},
        }
        self.env = {"AIRFLOW_CONN_AWS_DEFAULT": json.dumps(conn)}
        self.s3 = s3
        land(tmp_path / "landing", round_=0, files=FILES)
        land(tmp_path / "round1", round_=1, files=FILES)
        query = self.query()
        landing = Path(query.source.path)  # the sample dataset it reads
        last = sorted(landing.iterdir())[-1]
        held_back = tmp_path / last.name
        os.replace(last, held_back)  # arrives after the first run: the drain reads it
        run_in_session(spark, self.path, name)
        os.replace(held_back, last)
        self.old = query.checkpoint  # the old checkpoint: local, or in S3 (entry's checkpoint)
        as_parquet(
            sorted((tmp_path / "round1" / landing.name).iterdir()),
            tmp_path / "landing_v2" / name,
            query.source.schema_,
        )

    def edit_registry(self, **top_level) -> None:
        raw = yaml.safe_load(self.path.read_text())
        raw.update(top_level)
        self.path.write_text(yaml.safe_dump(raw, sort_keys=False))

    def query(self, name: str | None = None):
        return load_registry(self.path).query(name or self.name)

    def conf(self, name: str | None = None, **extra) -> dict:
        name = name or self.name
        return {
            "query": name,
            "new_source_format": "parquet",
            "new_source_path": f"landing_v2/{name}",
            "new_source_options": {"maxFilesPerTrigger": 1},
            "dry_run": False,
            **extra,
        }

    def trigger(self, conf: dict, **env: str):
        """``airflow dags test stream_source_migration --conf CONF``: (run, its log)."""
        from tests.dag.test_stream_start_run import _airflow

        run = _airflow(
            self.root,
            "dags",
            "test",
            "stream_source_migration",
            "--conf",
            json.dumps(conf),
            env={**self.env, **env},
        )
        return run, run.stdout + run.stderr


def uninterrupted(spark, tmp_path: Path, name: str, **entry):
    """The query run once over both rounds, on one source: what the migration must equal."""
    whole = write_registry(tmp_path / "whole", **{name: entry})
    land(tmp_path / "whole" / "landing", round_=0, files=FILES)
    land(tmp_path / "whole" / "landing", round_=1, files=FILES)
    run_in_session(spark, whole, name)
    return load_registry(whole).query(name)


def _rows(sink: Path) -> Counter:
    return Counter(row for rows in read_sink(sink).values() for row in rows)


def _state(spark, checkpoint: str, name: str) -> list[list[str]]:
    """State rows per variable, whatever partition holds them (the initialState road may run
    on another number of partitions); for a transform (transplant road only), every store's
    rows, as Spark's state-metadata names them (harness.spark_state_reads)."""
    batch = load_checkpoint(checkpoint).last_committed_batch
    reads = READS.get(name) or [
        options for _, options in spark_state_reads(spark, checkpoint, batch).values()
    ]
    return [
        sorted(re.sub(r", partition_id=\d+\)$", ")", r) for r in rows)
        for rows in read_state(spark, checkpoint, reads)
    ]


def assert_migrated(
    spark, m: Migration, whole, run_log: str, road: str, name=None, new: str | None = None
) -> int:
    """The migration of ``name`` took ``road`` to checkpoint ``new`` (default: the old one's
    ``.v2``) and, after the rest of the new source, its state and output equal the
    uninterrupted run's; the old checkpoint is retired. Returns the sink folder of its first
    new batch."""
    name = name or m.name
    query = m.query(name)
    old_checkpoint = m.old if name == m.name else str(m.root / "checkpoints" / name)
    new = new or old_checkpoint + ".v2"
    assert query.source.format == "parquet" and query.checkpoint == new
    assert f"{name}: switched to" in run_log and "carry-over proven" in run_log
    lineage = json.loads((audit_dir(query.checkpoint) / "lineage.json").read_text())
    assert lineage["carry_over"] == road, lineage
    old = load_checkpoint(old_checkpoint)
    assert lineage["from"]["last_committed_batch"] == old.last_committed_batch
    assert lineage["from"]["query_id"] == old.query_id
    backups = list_backups(f"s3://backups/{m.root.name}/{name}", m.s3.client())
    assert lineage["backup_id"] in [b["backup_id"] for b in backups]
    assert (read_retired(old_checkpoint) or {}).get("state") == "retired", "the old is held"
    if isinstance(location(old_checkpoint), Path):
        assert all(
            not p.stat().st_mode & stat.S_IWUSR
            for p in Path(old_checkpoint).rglob("*")
            if p.is_file()
        ), "the old checkpoint is kept read-only"
    # The new checkpoint's first batch writes the sink folder after the old one's last (after
    # Spark's repartition batch, which writes no output, where the partition count changed).
    gap = int(
        old.last_committed_batch + 1 in load_checkpoint(query.checkpoint).repartition_batches()
    )
    first = old.last_committed_batch + 1 + gap if road == "transplant" else 0
    assert query.sink.folder_batch(first) == old.last_committed_batch + 1 + gap
    assert f"output continues at batch_id={query.sink.folder_batch(first)}" in run_log

    run_in_session(spark, m.path, name)  # the rest of the new source, after the switch
    query = m.query(name)
    assert load_checkpoint(query.checkpoint).last_committed_batch >= first + FILES - 1
    assert _state(spark, query.checkpoint, name) == _state(spark, whole.checkpoint, name), (
        "state differs from the uninterrupted run's"
    )
    assert _rows(Path(query.sink.path)) == _rows(Path(whole.sink.path))
    return query.sink.folder_batch(first)


# Every step after preflight, with the road it is on. A failed run costs the steps before it, so
# a session injects a failure after three steps always (the first Spark step, the bootstrap on
# the initialState road, the switch on the transplant road after its first batch and proof) and
# after ROTATING of the other nine, chosen by the session's fault seed (STATEOPS_FAULT_SEED, set
# once per session and printed at its end with the steps it chose): successive runs cover them
# all, and a seed replays its choice. STATEOPS_ALL_FAULTS=1: every step.
STEPS = [
    ("stop_query", "auto"),
    ("drain", "auto"),
    ("backup", "auto"),
    ("carry_over", "auto"),
    ("transplant", "auto"),
    ("first_batch", "auto"),
    ("export", "initial_state"),
    ("validate_export", "initial_state"),
    ("bootstrap", "initial_state"),
    ("prove", "auto"),
    ("validate_new_state", "auto"),
    ("switch", "auto"),
]
ALWAYS = ("drain", "bootstrap", "switch")
ROTATING = 2


def fault_steps(seed: int, every: bool = False) -> list[tuple[str, str]]:
    """The steps a session fails after: ALWAYS and ROTATING others chosen by ``seed``."""
    others = [s for s in STEPS if s[0] not in ALWAYS]
    chosen = set(others if every else random.Random(f"{seed}:migration").sample(others, ROTATING))
    return [s for s in STEPS if s[0] in ALWAYS or s in chosen]


FAULTS = fault_steps(
    int(os.environ["STATEOPS_FAULT_SEED"]), bool(os.environ.get("STATEOPS_ALL_FAULTS"))
)


def assert_rolled_back(
    m: Migration, step: str, drained: dict | None, new: str | None = None
) -> dict | None:
    """After a failure at ``step``: the query runs on its old source and checkpoint as before,
    nothing of the failed run is left in the way (the new checkpoint ``new``, default the old
    one's ``.v2``, moved aside; in S3 set aside in place, under a hold). Returns the old
    checkpoint's digest once the drain ran (from then on it is fixed), to hand to the next
    call."""
    from stateops.control.lock import read_hold

    query = m.query()
    old = m.old
    assert (query.source.format, query.checkpoint, query.sink.batch_offset) == (
        "json",
        str(old),
        0,
    ), f"after a failure at {step}, the registry still points at the old source"
    assert read_hold(load_registry(m.path).lock_path(m.name)) is None, "the hold is released"
    assert read_retired(old) is None, "the old checkpoint is not retired"
    new = new or f"{old}.v2"
    if isinstance(location(new), S3Path):
        assert not occupied(new) or (read_retired(new) or {}).get("state") == "set aside"
    else:
        assert not Path(new).exists(), "the new checkpoint is moved aside"
    if isinstance(location(old), Path):
        assert all(p.stat().st_mode & stat.S_IWUSR for p in Path(old).rglob("*") if p.is_file())
    folders = {int(f.name.split("=")[1]) for f in Path(query.sink.path).glob("batch_id=*")}
    assert max(folders) == load_checkpoint(old).last_committed_batch, (
        f"after a failure at {step}, the new checkpoint's output is moved aside"
    )
    now = digest(old)
    if step != "stop_query":  # the drain ran: from then on, the old checkpoint is fixed
        drained = drained or now
        assert now == drained, f"a failure at {step} changed the old checkpoint"
    return drained
