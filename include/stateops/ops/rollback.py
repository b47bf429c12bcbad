"""Rollback to batch N: batch N becomes the last committed batch, and everything after it goes.

Commits and offsets after N, source-log entries after N's, state versions after N + 1,
operator metadata and schema files written after N, then the RocksDB files and sidecars left
unreferenced (the deletion engine: :mod:`stateops.ops.deletion`); the sink's batch folders
after N are moved aside. A Kafka source rewinds to its offsets in ``offsets/N``: the preflight
refuses, changing nothing, a rollback whose records the broker no longer holds (or a broker
that does not answer); with a Kafka sink (at least once) the plan counts the records the
reprocessing writes again, and the rollback waits for that count to be confirmed
(``rewrite_output``). A rollback leaves a marker (``<checkpoint>.audit/rollback.json``)
while it runs; the query refuses to start until a rollback run has finished it, and a rerun
after a kill resumes.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateops.control.markers import (
    clear_repartition,
    clear_rollback,
    write_rollback,
)
from stateops.core import faults, fence
from stateops.core.checkpoint import Checkpoint, load_checkpoint
from stateops.core.errors import CheckpointError, StateOpsError
from stateops.core.kafka import KafkaDown, offsets_text
from stateops.core.plans import BackupFirst
from stateops.core.report import format_bytes
from stateops.core.sources import (
    kafka_entries,
    kafka_offsets,
    kafka_source_of,
    records_between,
    topic_offsets,
    unreadable,
)
from stateops.core.storage import S3Path, delete_keys, location
from stateops.ops.deletion import (
    audit_plan,
    deletion_plan,
    execute_plan,
    format_plan,
    plan_digest,
    refuse_gaps,
    refuse_unwritable_plan,
    restart_set,
)
from stateops.ops.pending import refuse_pending_rollback
from stateops.ops.repartition import record_partitions

if TYPE_CHECKING:
    from stateops.control.target import Target

__all__ = [
    "REWRITE_FLAG",
    "execute_sink_plan",
    "format_rollback_plan",
    "kafka_rewind",
    "kafka_rewrites",
    "plan_rollback",
    "plan_sink_rollback",
    "refuse_unconfirmed_rewrite",
    "run_rollback",
]


def plan_rollback(target: Target, to_batch: int) -> dict[str, Any]:
    """What a rollback of ``target``'s checkpoint to committed batch ``to_batch`` deletes (it
    becomes the last one)."""
    if to_batch < 0:
        raise StateOpsError(
            f"batch {to_batch}: batch ids start at 0; pick a committed batch listed by "
            "`stateops inspect`"
        )
    cp = load_checkpoint(target.checkpoint)
    pending = refuse_pending_rollback(cp.root, to_batch)
    refuse_gaps(cp)
    last = cp.last_committed_batch
    cp.require_committed(to_batch, "roll back to a later batch, or restore an older backup")
    keep = set(restart_set(cp, to_batch, "roll back to a later batch, or restore an older backup"))
    delete: dict[str, str] = {}
    for log, batches in (("commits", cp.commits), ("offsets", cp.offsets)):
        delete.update({f"{log}/{b}": "after-rollback-point" for b in batches if b > to_batch})
    for name, log in cp.sources.items():
        upper = cp.file_log_offset(to_batch, int(name)) if name.isdigit() else None
        upper = to_batch if upper is None else upper  # other sources' logs go by batch id
        for i, rel in log.items():
            if i > upper:
                delete[rel] = "after-rollback-point"
    for op in cp.operators:
        for b, rel in op.metadata_files.items():
            if b is not None and b > to_batch:
                delete[rel] = "after-rollback-point"
        for rel, written_by in op.schema_files.items():
            if written_by > to_batch and rel not in keep:
                delete[rel] = "after-rollback-point"
        for store in op.stores:
            for v in store.versions:
                if v > to_batch + 1:
                    delete.update(dict.fromkeys(store.version_files(v), "after-rollback-point"))
    partitions = [cp.partitions(last), cp.partitions(to_batch)]  # differ across a repartition
    changed = partitions if partitions[0] != partitions[1] else None
    plan = deletion_plan(
        cp, "rollback", delete, keep, to_batch=to_batch, resumes=pending, partitions=changed
    )
    if pending:  # decided and half done: what the broker holds now cannot stop its finish
        plan.update(kafka=kafka_rewind(cp, target, to_batch, refuse=False), rewrites=None)
    else:
        plan.update(
            kafka=kafka_rewind(cp, target, to_batch),
            rewrites=kafka_rewrites(cp, target, to_batch),
        )
    return plan


def _refused(cp: Checkpoint, to_batch: int) -> str:
    return f"{cp.root}: rollback to batch {to_batch} refused, nothing changed"


def kafka_rewind(
    cp: Checkpoint, target: Target, to_batch: int, *, refuse: bool = True
) -> list[dict[str, Any]]:
    """Per Kafka source of the checkpoint: the offsets a rollback to ``to_batch`` rewinds it to
    (``offsets/<to_batch>``, where the next batch starts reading) and how many records the
    batches after it read (read again). Refused in one line, changing nothing, where the
    broker no longer holds records from those offsets on (the restart would fail, or skip
    them), or does not answer. Without ``refuse`` (a rollback a kill interrupted: its marker
    holds the query until it finishes) that is said in ``missing`` instead."""
    entry = cp.offsets.get(to_batch)
    if entry is None:
        return []
    inputs = list(target.query.inputs.values()) if target.query is not None else []
    newest = cp.offsets[max(cp.offsets)].source_offsets
    rewinds = []
    for index, offsets in kafka_entries(entry.source_offsets).items():
        source = kafka_source_of(offsets, inputs)
        try:
            missing = unreadable(source, offsets)
        except KafkaDown as err:
            if not refuse:
                missing = f"not checked: {err}"
            else:
                raise KafkaDown(
                    f"{_refused(cp, to_batch)}: cannot check that the broker still holds "
                    f"{source.where} from batch {to_batch}'s offsets on: {err}"
                ) from None
        if missing and refuse:
            raise CheckpointError(
                f"{_refused(cp, to_batch)}: the broker no longer holds records the query would "
                f"read again: {missing}; roll back to a later batch"
            )
        then = kafka_offsets(newest[index]) if index < len(newest) else None
        rewinds.append(
            {
                "source": index,
                "topics": source.subscribed,
                "offsets": offsets,
                "reads_again": records_between(offsets, then or offsets),
                "missing": missing,
            }
        )
    return rewinds


def kafka_rewrites(cp: Checkpoint, target: Target, to_batch: int) -> dict[str, Any] | None:
    """With a Kafka sink (at least once: Kafka keeps what a batch wrote, and its re-run writes
    it again), how many records the batches after ``to_batch`` wrote to its topic, which the
    reprocessing writes again: those stamped at or after the first rolled-back batch's start
    (``batchTimestampMs`` of ``offsets/<to_batch + 1>``, taken once batch ``to_batch`` had
    committed, so after its last record), the query being the topic's only writer. None for
    a folder sink (its batch folders are moved aside and rewritten, nothing doubles)."""
    query = target.query
    if query is None or not query.sink.kafka or query.sink.topic is None:
        return None
    sink, first = query.sink, to_batch + 1
    found = {"topic": sink.topic, "first_batch": first, "since_ms": None, "records": 0}
    if first not in cp.offsets:  # nothing after it: nothing is written again
        return found
    since = cp.offsets[first].timestamp_ms
    try:
        at = topic_offsets([sink.topic], sink, since)
        end = topic_offsets([sink.topic], sink, "latest")
    except KafkaDown as err:
        raise KafkaDown(
            f"{_refused(cp, to_batch)}: cannot count the records the rolled-back batches wrote "
            f"to topic {sink.topic}: {err}"
        ) from None
    found.update(since_ms=since, records=records_between(at, end))
    return found


REWRITE_FLAG = "--rewrite-output"


def refuse_unconfirmed_rewrite(plan: dict[str, Any], confirmed: int | None) -> None:
    """Refuse, in one line, a rollback whose reprocessing writes records to a Kafka sink again
    unless ``confirmed`` is that count (``--rewrite-output N``, the backfill form's
    ``rewrite_output``): duplicates the topic's readers will see, agreed to knowingly."""
    rewrites = plan.get("rewrites")
    if not rewrites or not rewrites["records"] or confirmed == rewrites["records"]:
        return
    n = rewrites["records"]
    given = "" if confirmed is None else f"{REWRITE_FLAG} {confirmed} does not match: "
    raise StateOpsError(
        f"{plan['checkpoint']}: {given}reprocessing writes again the {n} records batches "
        f"{rewrites['first_batch']} on wrote to Kafka topic {rewrites['topic']} (at least once: "
        f"its readers get them twice); confirm with {REWRITE_FLAG} {n} (the backfill form: "
        f"rewrite_output {n}); nothing changed"
    )


def _kafka_lines(plan: dict[str, Any]) -> list[str]:
    lines = [
        f"  source {r['source']} (topic {','.join(r['topics'])}): rewinds to "
        f"{offsets_text(r['offsets'])}; {r['reads_again']} records read again"
        for r in plan.get("kafka") or []
    ]
    rewrites = plan.get("rewrites")
    if rewrites:
        n, first = rewrites["records"], rewrites["first_batch"]
        lines.append(
            f"  sink topic {rewrites['topic']} (Kafka, at least once): reprocessing writes again "
            f"the {n} records batches {first} on wrote (the topic's records stamped from batch "
            f"{first}'s start on)" + (f"; confirm with {REWRITE_FLAG} {n}" if n else "")
        )
    return lines


def format_rollback_plan(plan: dict[str, Any], dry_run: bool, then: str | None = None) -> str:
    """:func:`stateops.ops.deletion.format_plan` with, after the rollback point, where each
    Kafka source rewinds to and what a Kafka sink gets again."""
    lines = format_plan(plan, dry_run=dry_run, then=then).split("\n")
    return "\n".join(lines[:2] + _kafka_lines(plan) + lines[2:])


def plan_sink_rollback(
    sink: str | os.PathLike[str], to_batch: int, batch_offset: int = 0
) -> dict[str, Any]:
    """What makes a sink consistent with a rollback to ``to_batch``.

    A per-batch sink (``batch_id=K`` folders, the registered queries' ``foreachBatch``; K is
    the batch plus the sink's ``batch_offset``) moves the folders of later batches aside.
    Spark's file sink drops its ``_spark_metadata`` entries after ``to_batch`` and moves the
    data files only they name aside. Moved aside is
    ``<sink>/_rolled_back/<run id>/``: readers skip ``_`` folders, and nothing is lost.
    A sink in S3 is a per-batch sink (its folders are moved object by object).
    """
    root = location(sink)
    if isinstance(root, S3Path):
        names = root.top_level()
        if "_spark_metadata" in names:
            raise StateOpsError(
                f"{root}: a Spark file sink (its _spark_metadata log) in S3 cannot be rolled "
                "back by stateops yet; nothing changed: use a per-batch sink (the registry's "
                "folder sinks) or move the sink's later files aside by hand"
            )
        later = [n for n in names if n.startswith("batch_id=")]
        folders = sorted(n for n in later if int(n.split("=", 1)[1]) > to_batch + batch_offset)
        return {"path": str(root), "folders": folders, "log_entries": [], "data_files": []}
    folders = sorted(
        p.name
        for p in root.glob("batch_id=*")
        if int(p.name.split("=", 1)[1]) > to_batch + batch_offset
    )
    log_dir = root / "_spark_metadata"
    entries = {}
    if log_dir.is_dir():
        for p in log_dir.iterdir():
            m = re.fullmatch(r"(\d+)(\.compact)?", p.name)
            if m:
                entries[int(m.group(1))] = p.name
    later = sorted((b for b in entries if b > to_batch), reverse=True)
    data_files: list[str] = []
    if later:
        compacts = [b for b in entries if b <= to_batch and entries[b].endswith(".compact")]
        start = max(compacts) if compacts else 0
        kept = [entries.get(b) for b in range(start, to_batch + 1)]
        if None in kept:
            raise StateOpsError(
                f"{log_dir}: compacted after batch {to_batch} and the entries before it are gone; "
                "the file sink cannot be rolled back to that batch"
            )
        named_later = {p for b in later for p in _sink_log_paths(log_dir / entries[b])}
        named_kept = {p for name in kept for p in _sink_log_paths(log_dir / name)}
        data_files = sorted(named_later - named_kept)
    return {
        "path": str(root),
        "folders": folders,
        "log_entries": [entries[b] for b in later],
        "data_files": data_files,
    }


def _sink_log_paths(path: Path) -> list[str]:
    paths = []
    for line in path.read_text(encoding="utf-8").split("\n")[1:]:
        if line.strip():
            paths.append(json.loads(line)["path"])
    return paths


def execute_sink_plan(sink: dict[str, Any], run_id: str) -> None:
    """Move a sink plan's folders and files to ``<sink>/_rolled_back/<run_id>/``."""
    root = location(sink["path"])
    aside = root / "_rolled_back" / run_id
    if isinstance(root, S3Path):
        for name in sink["folders"]:
            faults.point("move")
            fence.guard()
            _move_s3(root, name, aside)
        return
    for name in sink["folders"]:
        faults.point("move")
        fence.guard()
        aside.mkdir(parents=True, exist_ok=True)
        if (root / name).exists():
            (root / name).rename(aside / name)
    for name in sink["log_entries"]:  # newest first, like the checkpoint's logs
        faults.point("delete")
        fence.guard()
        (root / "_spark_metadata" / name).unlink(missing_ok=True)
    for uri in sink["data_files"]:
        faults.point("move")
        fence.guard()
        src = Path(uri.removeprefix("file:"))
        if src.exists():
            dest = aside / src.relative_to(root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            src.rename(dest)


def _move_s3(root: S3Path, folder: str, aside: S3Path) -> None:
    """``root/folder`` to ``aside/folder`` in S3, which has no rename: each object copied
    server-side (boto3's managed copy, as a backup's: in parts above its threshold, so an
    object over CopyObject's 5 GB too), then the originals deleted, S3A's directory markers
    with them (a kill in between leaves both, never neither; the next run copies again what
    is left)."""
    source = root / folder
    keys = sorted(source._list(source.key + "/", delimiter=False, markers=True)[0])
    for key in keys:
        if not key.endswith("/"):
            dest = aside / folder / key[len(source.key) + 1 :]
            root._client.call(
                f"copy s3://{root.bucket}/{key} to {dest}",
                "copy",
                Bucket=dest.bucket,
                Key=dest.key,
                CopySource={"Bucket": root.bucket, "Key": key},
            )
    delete_keys(root, keys)


def run_rollback(
    target: Target,
    to_batch: int,
    *,
    run_id: str,
    backup: BackupFirst | None = None,
    dry_run: bool = False,
    log: Callable[[str], None] = print,
    sink: str | os.PathLike[str] | None = None,
    sink_batch_offset: int = 0,
    planned: str | None = None,
    operation: str = "rollback",
    rewrite_output: int | None = None,
) -> dict[str, Any]:
    """Make ``to_batch`` the last committed batch, under the query's lock: backup (``backup()``
    returns its id; the plan shows where it goes), marker, checkpoint deletions, sink, audit,
    marker removed; then a registered query's ``shuffle_partitions`` follows the checkpoint
    (back to before a repartition). A rerun after a kill resumes.
    ``sink``: the folder made consistent (default: the registered query's sink, with its
    ``batch_offset``). The plan it returns names the ``run_id`` (the sink's
    ``_rolled_back/<run_id>/``) and the ``backup_id``. ``planned``: the :func:`plan_digest` of
    the plan the operator saw (a backfill's); the rollback refuses, changing nothing, if the
    plan made under the lock differs from it. ``rewrite_output``: the count of records a Kafka
    sink gets again that the operator confirmed (:func:`refuse_unconfirmed_rewrite`)."""
    if sink is None and target.query is not None:
        sink, sink_batch_offset = target.query.sink.path, target.query.sink.batch_offset
    lock = target.lock(operation, run_id)

    def plan_all() -> dict[str, Any]:
        plan = plan_rollback(target, to_batch)
        plan["sink"] = plan_sink_rollback(sink, to_batch, sink_batch_offset) if sink else None
        plan["backup_to"] = backup.to if backup else None
        return plan

    plan = plan_all()  # before the lock, the backup and the marker: see run_cleanup
    if dry_run:
        log(format_rollback_plan(plan, dry_run=True))
        return plan
    refuse_unconfirmed_rewrite(plan, rewrite_output)
    refuse_unwritable_plan(plan, lock)
    with lock:
        started = time.time()
        plan = plan_all()
        if planned is not None and plan_digest(plan) != planned:
            raise CheckpointError(
                f"{plan['checkpoint']} changed since the plan was made (last committed batch now "
                f"{plan['last_committed_batch']}): nothing was rolled back; plan again"
            )
        refuse_unconfirmed_rewrite(plan, rewrite_output)
        refuse_unwritable_plan(plan, lock)
        log(format_rollback_plan(plan, dry_run=False))
        if pending := plan["resumes"]:  # an interrupted run already backed up and marked
            run_id, backup_id = pending["run_id"], pending.get("backup_id")
            log(f"resuming the interrupted rollback {run_id}")
        else:
            run_id, backup_id = lock.run_id, backup() if backup else None
            marker = {"to_batch": to_batch, "run_id": run_id, "backup_id": backup_id}
            write_rollback(target.checkpoint, marker)
        execute_plan(plan, log)
        if plan["sink"]:
            execute_sink_plan(plan["sink"], run_id)
        seconds = round(time.time() - started, 1)
        audit_plan(plan, run_id, "succeeded", backup_id=backup_id, seconds=seconds)
        clear_repartition(target.checkpoint)  # a rollback to before an interrupted one finishes it
        clear_rollback(target.checkpoint)
        if target.query is not None and target.registry is not None:
            record_partitions(target.registry, target.query.name, run_id)
    plan.update(run_id=run_id, backup_id=backup_id)
    log(
        f"rollback {run_id} of {plan['checkpoint']}: batch {to_batch} is the last committed "
        "batch; deleted "
        f"{plan['delete']['files']} files, {format_bytes(plan['delete']['bytes'])}"
        + (f"; backup {backup_id}" if backup_id else "; no backup")
        + f"; {seconds} s"
    )
    return plan
