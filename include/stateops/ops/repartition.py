"""Repartition: change the number of state partitions of a stopped query, keeping its state.

Spark 4.2's engine does the work (``StreamingCheckpointManager.repartition``, run by the Spark
job ``stateops/jobs/repartition_state.py``): it writes one batch, N + 1, that reads no input and
holds the state of batch N re-hashed into the new number of partitions (its offsets entry
records the count; the query continues with it). It only adds files: the offsets and commit
of N + 1 and a snapshot of version N + 2 in every new partition (verified on every stateful
operator Spark supports, tests/spark/test_repartition.py). Around it, this module:

1. plans, refusing what must not be repartitioned (:func:`plan_repartition`);
2. prepares under the query's lock (:func:`prepare_repartition`): backup, then a marker
   (``<checkpoint>.audit/repartition.json``) with every file the checkpoint holds; while it
   exists the query does not start, clean up or back up into a half-written state;
3. after the job, checks Spark's work and its proof and records the new count
   (:func:`finish_repartition`);
4. on any failure, or when a killed run left the marker, undoes it (:func:`undo_repartition`):
   deletes every file the marker does not list, which gives back the checkpoint as it was
   (checked file by file); a rollback to batch N finishes an interrupted run too.

:func:`run_repartition` is all of it in one process (the CLI); the DAG runs the steps as
tasks with the job as a ``spark-submit`` between them. Each of them takes the query's lock;
:func:`repartition_locked` and :func:`undo_repartition_locked` are for a caller that holds it
(a start that repartitions a transplanted checkpoint).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateops.control.audit import append_audit, audit_dir
from stateops.control.markers import clear_repartition, read_repartition, write_repartition
from stateops.core import faults
from stateops.core.checkpoint import Checkpoint, interrupted_batch, load_checkpoint
from stateops.core.errors import CheckpointError, OperationFailed, StateOpsError, one_line
from stateops.core.formats import EXTRA_KEY_FIELDS
from stateops.core.plans import BackupFirst, plan_head, plan_tail
from stateops.core.registry import Query, Registry, write_partitions
from stateops.core.storage import S3Path, location
from stateops.core.verify import error_summary, verify_checkpoint
from stateops.kinds.files import FILES

if TYPE_CHECKING:
    from stateops.control.target import Target

__all__ = [
    "MAX_PARTITIONS",
    "OPERATION",
    "finish_repartition",
    "format_repartition_plan",
    "plan_repartition",
    "prepare_repartition",
    "proof_path",
    "record_partitions",
    "repartition_locked",
    "repartition_unsupported",
    "run_repartition",
    "undo_repartition",
    "undo_repartition_locked",
]

OPERATION = "repartition"
# Each partition is a state store opened by every batch: past this it is a typo, not a plan.
MAX_PARTITIONS = 10_000


def proof_path(checkpoint: str | os.PathLike[str], run_id: str) -> Path | S3Path:
    """Where the Spark job writes its proof of run ``run_id``."""
    return audit_dir(checkpoint) / f"repartition-{run_id}.proof.json"


def plan_repartition(target: Target, partitions: int) -> dict[str, Any]:
    """What a repartition of ``target``'s checkpoint to ``partitions`` would do, or a one-line
    refusal that changes nothing. A repartition a killed run left behind is part of the plan:
    it is undone first."""
    return _plan(target.checkpoint, partitions, target.query)


def _plan(
    checkpoint: str | os.PathLike[str], partitions: int, query: Query | None = None
) -> dict[str, Any]:
    if partitions < 1 or partitions > MAX_PARTITIONS:
        raise StateOpsError(
            f"--partitions {partitions}: give a number of state partitions from 1 to "
            f"{MAX_PARTITIONS}"
        )
    cp = load_checkpoint(checkpoint)
    pending = read_repartition(cp.root)  # a killed run's: planned as the checkpoint it found
    last = cp.last_committed_batch if pending is None else pending["batch"] - 1
    if last is None:
        raise CheckpointError(
            f"{cp.root}: no committed batch yet: there is no state to repartition"
        )
    if pending is None and cp.uncommitted_batches:
        raise CheckpointError(
            f"{cp.root}: {interrupted_batch(cp.uncommitted_batches[0])}: "
            "run the query until it commits (stateops run QUERY), or drop it "
            f"(stateops rollback {cp.root} --to-batch {cp.last_committed_batch}), then "
            "repartition"
        )
    if not cp.operators:
        raise CheckpointError(f"{cp.root}: no stateful operator: there is no state to repartition")
    before = cp.partitions(last) or max(op.num_partitions for op in cp.operators)
    if pending is not None:
        before = pending["partitions_before"]
    if before == partitions:
        raise StateOpsError(
            f"{cp.root}: the state already has {partitions} partitions; nothing to change"
        )
    unsupported = repartition_unsupported(cp, query)
    if unsupported:
        raise CheckpointError(f"{cp.root}: {unsupported}")
    if pending is None:
        result = verify_checkpoint(cp.root)
        if not result["ok"]:
            raise CheckpointError(
                f"{cp.root} failed verification ({error_summary(result)}): nothing was "
                "repartitioned; `stateops verify` lists every finding"
            )
    return {
        "operation": OPERATION,
        "checkpoint": str(cp.root),
        "query_id": cp.query_id,
        "last_committed_batch": last,
        "batch": last + 1,
        "partitions_before": before,
        "partitions": partitions,
        "operators": [
            {
                "operator_id": op.operator_id,
                "operator_name": op.operator_name,
                "stores": op.store_names,
            }
            for op in cp.operators
        ],
        "files": len(cp.sizes),
        "resumes": pending and {k: v for k, v in pending.items() if k != "files"},
    }


def repartition_unsupported(cp: Checkpoint, query: Query | None = None) -> str | None:
    """Why the repartition cannot take ``cp``'s state (None: it can), with the replay that
    would rebuild it for ``query``'s sources."""
    if cp.format_version != 1:
        # Spark 4.2's repartition loads each store without its checkpoint id, reading the file
        # names as v1 (NumberFormatException on "<version>_<id>"): seen here, not Spark's claim.
        return (
            f"checkpoint format v{cp.format_version}: repartition reads format v1 only "
            "(Spark 4.2's repartition loads the state without its checkpoint ids)"
        )
    for op in cp.operators:
        if op.operator_name not in EXTRA_KEY_FIELDS:
            return (
                f"operator {op.operator_id} ({op.operator_name}): Spark 4.2's repartition "
                f"takes only {', '.join(EXTRA_KEY_FIELDS)}; {_replay('', query)}"
            )
    for op in cp.operators:
        if op.provider != "rocksdb":
            # Spark refuses it (STATE_REPARTITION_INVALID_CHECKPOINT.UNSUPPORTED_PROVIDER), and
            # no carry-over changes a checkpoint's provider: a replay is the only road left.
            return (
                f"operator {op.operator_id} ({op.operator_name}) keeps its state in "
                f"{op.provider}: Spark repartitions RocksDB state only; no operation moves "
                "state to another store, so "
                + _replay(
                    " and `state_store: {provider: rocksdb}` (repartitionable from then on)", query
                )
            )
    return None


def _replay(also: str, query: Query | None) -> str:
    """The one road to another partition count where Spark's repartition cannot go: for
    ``query``'s sources (a topic or a folder; None: not known, a folder's is said)."""
    kinds = [source.kind for source in query.inputs.values()] if query is not None else []
    # a source whose input expires says what must still be there; none known: a folder's
    kind = next((k for k in kinds if k.expires), kinds[0] if kinds else FILES)
    held, start, first = kind.replay
    return (
        f"replay the source instead: {held}, give the query in the registry a new "
        f"`checkpoint` folder, a new `sink.path` and the `shuffle_partitions` you "
        f"want{also}{start}, then `stateops run QUERY` rebuilds its state from the first {first}"
    )


def format_repartition_plan(plan: dict[str, Any], dry_run: bool) -> str:
    """The plan for a person, ending in what cannot be undone, where the backup goes
    (``plan["backup_to"]``, None for none) and how to undo (:mod:`stateops.core.plans`)."""
    lines = [
        plan_head(dry_run, f"repartition of {plan['checkpoint']}"),
        f"  state partitions {plan['partitions_before']} -> {plan['partitions']}, by Spark's "
        f"repartition: batch {plan['batch']} reads no input and holds the state of batch "
        f"{plan['last_committed_batch']} in {plan['partitions']} partitions",
    ]
    for op in plan["operators"]:
        stores = ", ".join(op["stores"])
        lines.append(f"  operator {op['operator_id']} {op['operator_name']}: stores {stores}")
    if plan["resumes"]:
        lines.append(f"  first undoes the interrupted repartition {plan['resumes']['run_id']}")
    backup_to = plan.get("backup_to")
    lines += plan_tail(
        irreversible="nothing: Spark's repartition only adds files (batch "
        f"{plan['batch']}); a failed run deletes them again",
        backup=f"to {backup_to}, before anything changes" if backup_to else "none",
        undo=f"stateops rollback {plan['checkpoint']} --to-batch {plan['last_committed_batch']}",
    )
    return "\n".join(lines)


def prepare_repartition(
    target: Target,
    partitions: int,
    *,
    run_id: str,
    backup: BackupFirst | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Under the query's lock: plan again, undo an interrupted run, back up, and write the
    marker that lists every file. The plan, with ``run_id`` and ``backup_id``."""
    with target.lock(OPERATION, run_id):
        return _prepare(target.checkpoint, partitions, run_id, backup, log)


def _prepare(
    checkpoint: str | os.PathLike[str],
    partitions: int,
    run_id: str,
    backup: BackupFirst | None,
    log: Callable[[str], None],
) -> dict[str, Any]:
    plan = _plan(checkpoint, partitions) | {"backup_to": backup and backup.to}
    log(format_repartition_plan(plan, dry_run=False))
    if plan["resumes"]:
        undo_repartition_locked(checkpoint, log=log)
    backup_id = backup() if backup else None
    cp = load_checkpoint(checkpoint)
    write_repartition(
        cp.root,
        {
            "run_id": run_id,
            "batch": plan["batch"],
            "partitions": partitions,
            "partitions_before": plan["partitions_before"],
            "backup_id": backup_id,
            "files": cp.sizes,
        },
    )
    plan.update(run_id=run_id, backup_id=backup_id, resumes=None)
    return plan


def finish_repartition(
    target: Target, *, run_id: str, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Under the query's lock, after the Spark job: batch N + 1 is committed with the new
    count, the job's proof holds and the checkpoint verifies clean; then the registry's count
    (``shuffle_partitions``, for a registered query), the audit record and the marker's
    removal. Raises, leaving the marker, when any of it does not hold."""
    registry = target.registry if target.query is not None else None
    with target.lock(OPERATION, run_id):
        return _finish(target.checkpoint, registry, target.name, log)


def _finish(
    checkpoint: str | os.PathLike[str],
    registry: Registry | None,
    query: str | None,
    log: Callable[[str], None],
) -> dict[str, Any]:
    pending = read_repartition(checkpoint)
    if pending is None:
        raise StateOpsError(f"{checkpoint}: no repartition under way to finish")
    root, batch, n = location(checkpoint), pending["batch"], pending["partitions"]
    cp = load_checkpoint(root)
    if cp.last_committed_batch != batch or cp.partitions(batch) != n:
        raise CheckpointError(
            f"{root}: Spark's repartition did not commit batch {batch} with {n} partitions "
            f"(last committed batch {cp.last_committed_batch}, "
            f"{cp.partitions(cp.last_committed_batch)} partitions)"
        )
    proof = _read_proof(root, pending["run_id"])
    result = verify_checkpoint(root)
    if not result["ok"]:
        raise CheckpointError(
            f"{root} failed verification after the repartition: {error_summary(result)}"
        )
    append_audit(
        root,
        OPERATION,
        run_id=pending["run_id"],
        result="succeeded",
        batch_before=batch - 1,
        batch_after=batch,
        backup_id=pending["backup_id"],
        partitions=[pending["partitions_before"], n],
        proof=str(proof_path(root, pending["run_id"])),
    )
    faults.point("finish")
    clear_repartition(root)
    if registry is not None and query is not None:
        record_partitions(registry, query, pending["run_id"])
    log(
        f"repartition {pending['run_id']} of {root}: {pending['partitions_before']} -> {n} "
        f"state partitions in batch {batch}; proven: {proof['summary']}"
    )
    return {**pending, "files": len(pending["files"]), "proof": proof}


def record_partitions(registry: Registry, name: str, run_id: str) -> int | None:
    """Make the registry's ``shuffle_partitions`` of query ``name`` the count its checkpoint
    runs with now (recorded with the migration switch; the registry file is not edited), after
    a repartition or a rollback to before one. Idempotent: a rerun after a kill heals it. The
    count recorded, or None when it already agreed."""
    query = registry.query(name)
    if read_repartition(query.checkpoint) is not None:
        return None  # under way: its finish records the count, its undo leaves it
    cp = load_checkpoint(query.checkpoint)
    count = cp.partitions(cp.last_committed_batch)
    if count is None or count == query.shuffle_partitions:
        return None
    write_partitions(
        registry,
        name,
        count,
        {"operation": OPERATION, "run_id": run_id, "partitions": [query.shuffle_partitions, count]},
    )
    return count


def _read_proof(root: Path | S3Path, run_id: str) -> dict[str, Any]:
    path = proof_path(root, run_id)
    try:
        proof = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(
            f"{path}: the repartition job left no readable proof ({err})"
        ) from None
    if not proof.get("ok"):
        raise CheckpointError(f"the repartition's proof failed: {proof.get('summary')} ({path})")
    return proof


def undo_repartition(
    target: Target, *, run_id: str, log: Callable[[str], None] = print
) -> dict[str, Any] | None:
    """Under the query's lock, after a failed step: undo repartition ``run_id``
    (:func:`undo_repartition_locked`); its marker, or None when there was nothing to undo."""
    with target.lock(OPERATION, run_id):
        return undo_repartition_locked(target.checkpoint, run_id=run_id, log=log)


def undo_repartition_locked(
    checkpoint: str | os.PathLike[str],
    *,
    run_id: str | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any] | None:
    """Give back the checkpoint as the repartition found it: delete every file its marker
    does not list (Spark's repartition only adds files), then check that exactly the listed
    files are there with their sizes; the marker goes last. Only run ``run_id``'s, if given.
    The caller holds the query's lock."""
    pending = read_repartition(checkpoint)
    if pending is None or run_id not in (None, pending["run_id"]):
        return None
    root = location(checkpoint)
    cp = load_checkpoint(root)
    before: dict[str, int] = pending["files"]
    added = sorted(rel for rel in cp.sizes if rel not in before)
    for rel in sorted(added, key=_newest_first):
        faults.point("delete")
        (root / rel).unlink(missing_ok=True)
    _remove_empty_dirs(root, added)
    after = load_checkpoint(root)
    now = after.sizes
    # Spark's own store maintenance may have deleted old files it no longer retains while
    # the job ran: gone is fine for those, not for anything a restart after batch N reads.
    missing = after.restart_requirements(pending["batch"] - 1)[1]
    gone = sorted(set(before) - set(now))
    changed = sorted({r for r in now if now[r] != before.get(r)} | set(missing))
    if changed:
        raise CheckpointError(
            f"{root}: could not give back the checkpoint as it was before repartition "
            f"{pending['run_id']} ({', '.join(changed[:3])} differ); restore backup "
            f"{pending['backup_id'] or '(none taken)'}: stateops restore"
        )
    if gone:
        log(
            f"{len(gone)} old files that no restart after batch {pending['batch'] - 1} reads "
            "were deleted by Spark's store maintenance meanwhile"
        )
    append_audit(
        root,
        OPERATION,
        run_id=pending["run_id"],
        result="undone",
        batch_before=pending["batch"] - 1,
        batch_after=pending["batch"] - 1,
        deleted=len(added),
    )
    clear_repartition(root)
    log(
        f"undid repartition {pending['run_id']}: deleted the {len(added)} files it added; "
        f"batch {pending['batch'] - 1} with {pending['partitions_before']} partitions is the "
        "last committed batch again"
    )
    return pending


def _newest_first(rel: str) -> tuple[int, str]:
    """The commit first, then offsets, then state: a kill in between leaves a checkpoint
    whose last batch is planned, not committed, which a rerun or a rollback finishes."""
    order = 0 if rel.startswith("commits/") else 1 if rel.startswith("offsets/") else 2
    return order, rel


def _remove_empty_dirs(root: Path | S3Path, added: list[str]) -> None:
    if isinstance(root, S3Path):  # S3 has no folders (S3A's markers are not listed)
        return
    for folder in sorted({(root / rel).parent for rel in added}, key=lambda p: -len(p.parts)):
        while folder != root and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent


def run_repartition(
    target: Target,
    partitions: int,
    *,
    run_id: str,
    backup: BackupFirst | None = None,
    dry_run: bool = False,
    log: Callable[[str], None] = print,
    submit: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Plan, prepare, ``submit(plan)`` (runs the Spark job and raises if it fails), finish;
    on any failure undo, and fail saying so. The query's lock is held throughout."""
    lock = target.lock(OPERATION, run_id)
    registry = target.registry if target.query is not None else None
    if registry is not None and not dry_run:
        record_partitions(registry, target.query.name, run_id)  # a run killed before it did
    plan = plan_repartition(target, partitions) | {"backup_to": backup and backup.to}
    if dry_run:
        log(format_repartition_plan(plan, dry_run=True))
        return plan
    with lock:
        return repartition_locked(
            target.checkpoint,
            partitions,
            run_id,
            submit=submit,
            backup=backup,
            registry=registry,
            query=target.name,
            log=log,
        )


def repartition_locked(
    checkpoint: str | os.PathLike[str],
    partitions: int,
    run_id: str,
    *,
    submit: Callable[[dict[str, Any]], Any],
    backup: BackupFirst | None = None,
    registry: Registry | None = None,
    query: str | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Prepare, ``submit(plan)``, finish; on any failure undo, and fail saying so. The caller
    holds the query's lock (:func:`run_repartition`, or a start that repartitions a
    transplanted checkpoint before its first batch)."""
    started = time.time()
    plan = _prepare(checkpoint, partitions, run_id, backup, log)
    try:
        submit(plan)
        done = _finish(checkpoint, registry, query, log)
    except BaseException as err:
        undo_repartition_locked(checkpoint, log=log)
        append_audit(
            checkpoint,
            OPERATION,
            run_id=plan["run_id"],
            result="failed",
            batch_before=plan["last_committed_batch"],
            error=one_line(err),
        )
        raise OperationFailed(
            f"the repartition of {checkpoint} failed ({one_line(err)}); it was undone: "
            f"batch {plan['last_committed_batch']} with {plan['partitions_before']} "
            "partitions is the last committed batch, as before"
            + (f" (backup {plan['backup_id']})" if plan["backup_id"] else "")
        ) from err
    done["seconds"] = round(time.time() - started, 1)
    return {**plan, **done}
