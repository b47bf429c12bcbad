"""The `stateops` command line. Bad input: one line on stderr, exit code 2, nothing changed."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stateops import __version__
from stateops.control.audit import audit_dir, read_audit
from stateops.control.lock import (
    describe_lock,
    force_release,
    live_lock,
    lock_state,
    read_hold,
    read_lock,
)
from stateops.core.checkpoint import load_checkpoint, require_checkpoint_dir
from stateops.core.errors import OperationFailed, StateOpsError, domain_errors, one_line
from stateops.core.plans import plan_head, plan_tail
from stateops.core.registry import (
    Query,
    Registry,
    load_registry,
    parse_duration,
    registry_path,
    use_connections,
)
from stateops.core.report import checkpoint_report, format_report
from stateops.core.steps import BOOTSTRAP, Step, fill
from stateops.core.verify import format_findings, verify_checkpoint
from stateops.dev.sampledata import DATASETS, generate_events, generate_initial_pages
from stateops.kinds import SOURCE_FORMATS
from stateops.kinds.kafka import KAFKA
from stateops.ops.bootstrap import FORMATS, format_bootstrap_plan, plan_bootstrap
from stateops.ops.transplant import ROADS
from stateops.spark.jobs import (
    job_path,
    job_submit,
    preflight_job,
    spark_submit_command,
    spark_submit_env,
    submit_args,
)
from stateops.status import format_status, query_status

__all__ = ["main"]


def _spark_submit(
    step: Step,
    fields: dict[str, Any],
    master: str,
    registry_file: str | None,
    *,
    to_stderr: bool = False,
) -> int:
    """Run ``step`` (a job of :mod:`stateops.core.steps`, its fields filled in with
    ``fields``) with the registry ``registry_file`` (None: the default one); its exit code."""
    job, _, args = fill(step, fields)
    registry = str(registry_path(registry_file))
    return _submit_job(job, master, "--registry", registry, *args, to_stderr=to_stderr)


def _submit_job(job: str, master: str, *args: str, to_stderr: bool = False) -> int:
    """Run ``stateops/jobs/<job>`` through the venv's spark-submit, once the job's checks that
    need no Spark passed here (a refusal costs no JVM start); its exit code. ``to_stderr``:
    the job's output too goes to stderr (stdout is the command's JSON)."""
    preflight_job(job_path(job), args)
    cmd = spark_submit_command(job, master, args, submit_args(job_submit(job_path(job), args)))
    out = sys.stderr if to_stderr else None
    return subprocess.run(cmd, stdout=out, env=spark_submit_env()).returncode


def cmd_inspect(args: argparse.Namespace) -> int:
    from stateops.control.target import resolve_target

    target = resolve_target(args.checkpoint, args.registry)
    min_deltas = args.min_deltas_for_snapshot or target.min_deltas_for_snapshot
    cp = load_checkpoint(target.checkpoint)
    if args.files_for_batch is not None:
        files = cp.restart_files(args.files_for_batch)
        if args.json:
            print(json.dumps({"batch": args.files_for_batch, "files": files}, indent=2))
        else:
            print("\n".join(files))
        return 0
    report = checkpoint_report(cp, min_deltas)
    print(
        json.dumps(report, indent=2) if args.json else format_report(report),
        end="" if not args.json else "\n",
    )
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from stateops.control.target import resolve_target
    from stateops.core.steps import VALIDATE

    target = resolve_target(args.checkpoint, args.registry)
    result = verify_checkpoint(target.checkpoint)
    print(json.dumps(result, indent=2) + "\n" if args.json else format_findings(result), end="")
    if not result["ok"] or not args.data:
        return 0 if result["ok"] else 1
    # The job's preflight refuses a name that is not a registered query's, before a JVM.
    fields = {"query": args.checkpoint, "json": args.json}
    return _spark_submit(VALIDATE, fields, args.master, args.registry)


def cmd_export(args: argparse.Namespace) -> int:
    from stateops.control.target import resolve_target
    from stateops.core.steps import EXPORT

    target = resolve_target(args.checkpoint, args.registry)
    fields = {"checkpoint": target.checkpoint, "out": args.out, "batch": args.batch}
    return _spark_submit(EXPORT, fields, args.master, args.registry)


def cmd_bootstrap(args: argparse.Namespace) -> int:
    from stateops.control.target import query_target

    target = query_target(args.registry, args.query)
    plan = plan_bootstrap(
        target, args.initial_state, args.format, args.carry_over, args.accept_differences
    )
    print(format_bootstrap_plan(plan, args.dry_run))
    if args.dry_run:
        return 0
    fields = {
        "query": args.query,
        "initial_state": plan["initial_state"],
        "format": plan["format"],
        "carry_over": args.carry_over,
        "accept": args.accept_differences,
    }
    return _spark_submit(BOOTSTRAP, fields, args.master, str(target.require_registry().path))


def _s3(args: argparse.Namespace):
    from stateops.core.s3 import s3_client, s3_settings

    return s3_client(s3_settings(args.conn_id))


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def cmd_backup(args: argparse.Namespace) -> int:
    from stateops.control.target import resolve_target
    from stateops.ops.backup import run_backup

    target = resolve_target(args.checkpoint, args.registry)
    print(json.dumps(run_backup(target, _s3(args), batch=args.batch, to=args.to, log=_log)))
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from stateops.control.lock import new_run_id
    from stateops.core.s3 import names_a_url
    from stateops.ops.restore import format_restore_plan, plan_restore, run_restore

    # With a URL the registry only says whose checkpoint the target is (whose lock to take):
    # none to read, no lock; one that cannot be read is an error, not a silent "no lock".
    with_registry = not names_a_url(args.source) or registry_path(args.registry).exists()
    registry = load_registry(args.registry) if with_registry else None
    client = _s3(args)
    plan = plan_restore(
        args.source,
        client,
        backup=args.backup,
        to=args.to,
        registry=registry,
        replace=args.replace,
        allow_other_query=args.allow_other_query,
    )
    color = sys.stderr.isatty() and "NO_COLOR" not in os.environ
    _log(format_restore_plan(plan, dry_run=args.dry_run, color=color))
    if args.dry_run:
        print(json.dumps(plan))
        return 0
    run_id = new_run_id("restore")
    print(json.dumps(run_restore(plan, client, registry=registry, run_id=run_id, log=_log)))
    return 0


def cmd_drill(args: argparse.Namespace) -> int:
    from stateops.control.lock import new_run_id
    from stateops.control.target import query_target
    from stateops.core.steps import EXPORT
    from stateops.ops.drill import READ_FIELDS, begin_drill, finish_drill

    target = query_target(args.registry, args.query)
    client = _s3(args)
    plan = begin_drill(target, client, backup_id=args.backup, run_id=new_run_id("drill"), log=_log)
    if plan is None:
        raise StateOpsError(
            f"{args.query}: no backups under {target.backup_location()}: nothing to drill; "
            f"back it up first (stateops backup {args.query})"
        )
    fields = {field: plan[key] for field, key in READ_FIELDS.items()}
    try:
        code = _spark_submit(EXPORT, fields, args.master, args.registry, to_stderr=True)
        failed = None if code == 0 else f"Spark did not read its state (the export exited {code})"
    except StateOpsError as err:
        failed = f"its state cannot be read: {one_line(err)}"
    print(json.dumps(finish_drill(plan, client, failed=failed, log=_log)))
    return 0


def cmd_backups(args: argparse.Namespace) -> int:
    from stateops.control.target import query_target
    from stateops.core.s3 import names_a_url
    from stateops.ops.backup import describe_drill, list_backups, prune_backups, verify_backup

    url = args.url
    if args.action != "verify" and not names_a_url(url):  # a registered query's backups
        url = query_target(args.registry, url).backup_location()
    if args.action == "list":
        rows = list_backups(url, _s3(args))
        if args.json:
            print(json.dumps(rows, indent=1, default=str))
            return 0
        for r in rows:
            print(
                f"{r['backup_id']}  batch {r['batch_id']:>6}  {r['files']:>6} files  "
                f"{r['bytes']:>12} bytes  {r['created_at']}  {describe_drill(r['drill'])}"
            )
        print(f"{len(rows)} backups under {url}")
        return 0
    if args.action == "prune":
        plan = prune_backups(
            url,
            _s3(args),
            keep_last=args.keep_last,
            max_age=args.max_age,
            grace=args.grace,
            dry_run=args.dry_run,
        )
        verb = "would delete" if plan["dry_run"] else "deleted"
        gone = (
            f"{len(plan['deleted_backups'])} backups and {plan['deleted_objects']} "
            f"unreferenced objects, {plan['freed_bytes']} bytes"
        )
        lines = [
            f"  keeps {len(plan['kept'])} backups: {', '.join(plan['kept'])}"
            + (
                f" ({plan['kept_for_drill']}: the newest that passed a restore drill)"
                if plan["kept_for_drill"]
                else ""
            ),
            f"  {verb} {len(plan['deleted_backups'])} backups: "
            f"{', '.join(plan['deleted_backups']) or '-'}",
            f"  {verb} {plan['deleted_objects']} unreferenced objects, {plan['freed_bytes']} bytes"
            + (
                ""
                if plan["dry_run"]
                else f" (in trash/ until a prune after the grace, {args.grace})"
            ),
        ]
        if plan["put_back"]:
            lines.append(f"  put back {plan['put_back']} objects a backup taken meanwhile names")
        if plan["dry_run"]:
            lines = [
                plan_head(True, f"prune of the backups under {url}"),
                *lines,
                *plan_tail(
                    irreversible=f"deleting {gone}",
                    backup="none",
                    undo="none: a deleted backup is gone",
                ),
            ]
        print("\n".join(lines))
        return 0
    result = verify_backup(args.url, _s3(args))
    if args.json:
        print(json.dumps(result, indent=1))
        return 0 if result["ok"] else 1
    for problem in result["problems"]:
        print(f"ERROR    {problem}")
    verdict = "OK" if result["ok"] else "FAILED"
    print(f"{verdict}: {result['backup_id']}: {result['objects']} objects checked")
    return 0 if result["ok"] else 1


def cmd_cleanup(args: argparse.Namespace) -> int:
    from stateops.control.lock import new_run_id
    from stateops.control.target import resolve_target
    from stateops.core.s3 import s3_client, s3_settings
    from stateops.ops.cleanup import run_cleanup

    plan = run_cleanup(
        resolve_target(args.checkpoint, args.registry),
        args.retain_batches,
        run_id=new_run_id("cleanup"),
        dry_run=args.dry_run,
        log=_log if args.json else print,
        client=lambda: s3_client(s3_settings(), retries=0),  # one try: it does not wait for S3
    )
    if args.json:
        print(json.dumps(plan, indent=1))
    return 0


def _backup_first(args: argparse.Namespace, target: Any, operation: str) -> Any:
    """The backup before ``operation`` (to ``--backup-to``, else the target's backup location;
    none with ``--no-backup``): :func:`stateops.ops.backup.backup_first`, refused before the
    lock when there is no location or the S3 settings are bad."""
    from stateops.ops.backup import backup_first

    if args.no_backup:
        return None
    give = "--backup-to s3://BUCKET/PREFIX (or --no-backup)"
    where = target.backup_location(args.backup_to, give)  # no location: refused before S3's
    return backup_first(target, _s3(args), operation, to=where, log=_log)


def cmd_rollback(args: argparse.Namespace) -> int:
    from stateops.control.lock import new_run_id
    from stateops.control.target import resolve_target
    from stateops.kinds import Sink
    from stateops.ops.rollback import run_rollback

    target = resolve_target(args.checkpoint, args.registry)
    backup = _backup_first(args, target, "rollback")
    plan = run_rollback(
        target,
        args.to_batch,
        run_id=new_run_id("rollback"),
        backup=backup,
        dry_run=args.dry_run,
        log=_log if args.json else print,
        sink=Sink(path=args.sink) if args.sink else None,
        rewrite_output=args.rewrite_output,
    )
    if args.json:
        print(json.dumps(plan, indent=1))
    return 0


def cmd_repartition(args: argparse.Namespace) -> int:
    from stateops.control.lock import new_run_id
    from stateops.control.target import resolve_target
    from stateops.core.steps import REPARTITION, REPARTITION_STATE
    from stateops.ops.repartition import run_repartition

    target = resolve_target(args.checkpoint, args.registry)
    backup = _backup_first(args, target, "repartition")

    def submit(plan: dict) -> None:
        fields = {"checkpoint": target.checkpoint, "run_id": plan["run_id"]}
        code = _spark_submit(REPARTITION, fields, args.master, args.registry, to_stderr=args.json)
        if code != 0:
            raise StateOpsError(f"{REPARTITION_STATE} exited with code {code} (see above)")

    result = run_repartition(
        target,
        args.partitions,
        run_id=new_run_id("repartition"),
        backup=backup,
        dry_run=args.dry_run,
        log=_log if args.json else print,
        submit=submit,
    )
    if args.json:
        print(json.dumps(result, indent=1))
    return 0


def cmd_transplant(args: argparse.Namespace) -> int:
    from stateops.control.lock import new_run_id
    from stateops.control.target import resolve_target
    from stateops.ops.transplant import run_transplant

    result = run_transplant(
        resolve_target(args.old, args.registry),
        args.new,
        query=args.query,
        source=args.source,
        source_format=args.source_format,
        source_path=args.source_path,
        source_topic=args.source_topic,
        source_bootstrap_servers=args.source_bootstrap_servers,
        source_start=args.source_start,
        cutover=args.cutover,
        batch=args.batch,
        run_id=new_run_id("transplant"),
        dry_run=args.dry_run,
        log=_log,
    )
    print(json.dumps(result))
    return 0


def _job_runner(master: str):
    """``run_job(job, registry_file, args)`` for the library's one-process runs: the job
    through ``spark-submit``, raising when it fails."""

    def run_job(job: str, registry_file: str, job_args: list[str]) -> None:
        code = _submit_job(job, master, "--registry", registry_file, *job_args)
        if code != 0:
            raise StateOpsError(f"{job} exited with code {code} (its output is above)")

    return run_job


def cmd_backfill(args: argparse.Namespace) -> int:
    from stateops.control.lock import new_run_id
    from stateops.control.target import query_target
    from stateops.ops.backfill import plan_backfill, run_backfill
    from stateops.ops.backup import backup_first

    target, run_id = query_target(args.registry, args.query), new_run_id("backfill")
    log = _log if args.json else print
    plan = plan_backfill(
        target,
        run_id,
        to_batch=args.to_batch,
        input_before=args.input_before,
        overrides=args.overrides,
        rewrite_output=args.rewrite_output,
        dry_run=args.dry_run,
        log=log,
    )
    if args.dry_run:
        if args.json:
            print(json.dumps(plan, indent=1))
        return 0
    client = _s3(args)  # bad S3 settings: refused before the lock
    backup = backup_first(target, client, "backfill", log=_log)
    done = run_backfill(
        target, plan, run_id=run_id, backup=backup, run_job=_job_runner(args.master), log=log
    )
    if args.json:
        print(json.dumps(done, indent=1))
    return 0


def _overrides(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not JSON: {err}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("a JSON object, e.g. '{\"processor\": {...}}'")
    return value


def cmd_migrate(args: argparse.Namespace) -> int:
    from stateops.control.lock import new_run_id
    from stateops.control.target import query_target
    from stateops.ops.migration import format_migration_plan, plan_migration

    target = query_target(args.registry, args.query)
    source = {
        "format": args.new_source_format,
        "path": args.new_source_path or "",
        "topic": args.new_source_topic or "",
        "bootstrap_servers": args.new_source_bootstrap_servers or "",
        "start": args.new_source_start or "",
        "schema": args.new_source_schema or "",
        "options": dict(args.new_source_option),
    }
    plan = plan_migration(
        target,
        source,
        args.new_checkpoint or "",
        new_run_id("migration"),
        args.cutover,
        args.carry_over,
        args.accept_differences,
        args.source or "",
    )
    _log(format_migration_plan(plan, args.dry_run))
    if args.dry_run:
        print(json.dumps(plan))
        return 0
    print(json.dumps(migrate_planned(target, plan, _s3(args), args.master)))
    return 0


def migrate_planned(target: Any, plan: dict[str, Any], s3: Any, master: str) -> dict[str, Any]:
    """What ``stateops migrate`` does with a plan (:func:`plan_migration`'s): the backup first
    (bad S3 settings are refused before the query is held), then every step, its Spark jobs
    on ``master``; the lineage the switch recorded."""
    from stateops.ops.backup import backup_first
    from stateops.ops.migration import run_migration

    backup = backup_first(target, s3, "migration", log=_log)
    return run_migration(target, plan, backup=backup, run_job=_job_runner(master), log=_log)


def cmd_upgrade(args: argparse.Namespace) -> int:
    from stateops.control.lock import new_run_id
    from stateops.control.target import query_target
    from stateops.ops.backup import backup_first
    from stateops.ops.upgrade import format_upgrade_plan, plan_upgrade, run_upgrade

    target = query_target(args.registry, args.query)
    plan = plan_upgrade(target, args.new_checkpoint or "", new_run_id("upgrade"))
    _log(format_upgrade_plan(plan, args.dry_run))
    if args.dry_run or not plan["rewrite"]:
        print(json.dumps(plan))
        return 0
    backup = backup_first(target, _s3(args), "upgrade", log=_log)
    run_job = _job_runner(args.master)
    print(json.dumps(run_upgrade(target, plan, backup=backup, run_job=run_job, log=_log)))
    return 0


def cmd_unretire(args: argparse.Namespace) -> int:
    from stateops.control.target import resolve_target
    from stateops.ops.migration import unretire

    held = unretire(resolve_target(args.checkpoint, args.registry).checkpoint, log=_log)
    print(json.dumps({"checkpoint": args.checkpoint, "lifted": held}))
    return 0


def _option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def cmd_queries(args: argparse.Namespace) -> int:
    registry = load_registry(args.registry)
    errors = registry.invalid | _code_errors(registry)
    for error in errors.values():  # one line each on stderr (exit 2), then the listing
        print(f"error: {error}", file=sys.stderr)
    if args.json:
        print(
            json.dumps(
                {
                    "registry": str(registry.path),
                    "data_dir": str(registry.data_dir),
                    "queries": [
                        _query_json(registry, q) | {"error": errors.get(q.name)}
                        for q in registry.queries.values()
                    ]
                    + [{"name": n, "error": error} for n, error in registry.invalid.items()],
                },
                indent=1,
            )
        )
        return 2 if errors else 0
    print(f"registry {registry.path} (data under {registry.data_dir})")
    for q in registry.queries.values():
        print(
            f"  {q.name:<16} {q.inputs_text} -> {q.sink.where}\n"
            f"  {'':<16} checkpoint {q.checkpoint} ({q.state_store.provider}, "
            f"{q.shuffle_partitions} partitions)"
        )
        if note := registry.switch_note(q.name):
            print(f"  {'':<16} {note}")
    for name in registry.invalid:
        print(f"  {name:<16} refused: its entry is invalid (the error above); it cannot run")
    return 2 if errors else 0


def _code_errors(registry: Registry) -> dict[str, str]:
    """Each query whose own code does not load as ``run`` loads it (its module, its function or
    class, its options), with the one line that says why."""
    from stateops.spark.streaming import check_code

    errors = {}
    for query in registry.queries.values():
        try:
            check_code(query)
        except StateOpsError as err:
            errors[query.name] = one_line(err)
    return errors


def _query_json(registry: Registry, q: Query) -> dict[str, Any]:
    switch = registry.switch_path(q.name)
    return {
        "name": q.name,
        "sources": q.inputs_brief,
        "sink": q.sink.where,
        "checkpoint": q.checkpoint,
        "provider": q.state_store.provider,
        "partitions": q.shuffle_partitions,
        "switch": str(switch) if switch.exists() else None,
    }


HISTORY_DEFAULT = "1 day"  # stateops status --history without a DURATION


def cmd_status(args: argparse.Namespace) -> int:
    registry = load_registry(args.registry)
    if args.query is None and args.history in registry.names:  # `status --history QUERY`
        args.query, args.history = args.history, HISTORY_DEFAULT
    names = [args.query] if args.query else registry.names
    client = None if args.no_backups else _s3(args)
    history = parse_duration(args.history, "--history") if args.history else None
    statuses = [query_status(registry, name, client, history=history) for name in names]
    if args.json:
        print(json.dumps(statuses, indent=2, default=str))
    else:
        print("\n\n".join(format_status(s) for s in statuses))
    # A part unknown, or a query that cannot run as it is, is not healthy.
    return 1 if any(s["errors"] or s["health"]["verdict"] == "FAIL" for s in statuses) else 0


def cmd_generate(args: argparse.Namespace) -> int:
    if args.out:
        landing = {name: Path(args.out) / name for name in DATASETS}
    else:
        registry = load_registry(args.registry)
        queries = registry.queries
        landing = {name: Path(queries[name].source.path) for name in DATASETS if name in queries}
        if not landing:  # a user's own registry: writing nothing, silently, would look done
            raise StateOpsError(
                f"{registry.path}: no query is named {' or '.join(DATASETS)} (the sample "
                "datasets); give --out FOLDER to write them to FOLDER/<dataset>"
            )
    if args.initial_pages:
        path = generate_initial_pages(args.initial_pages, users=args.users, seed=args.seed)
        print(f"page_visits initial state: {path}")
    written = generate_events(
        landing,
        events_per_file=args.events,
        users=args.users,
        files=args.files,
        seed=args.seed,
        round_=args.round,
    )
    for name, paths in written.items():
        print(f"{name}: {len(paths)} files in {landing[name]}")
    return 0


def cmd_lock(args: argparse.Namespace) -> int:
    from stateops.control.target import query_target

    target = query_target(args.registry, args.query)
    name, path = target.name, target.lock_file
    if args.action == "release":
        live = live_lock(path)
        if live is not None and not args.force:
            raise StateOpsError(
                f"{describe_lock(name, live, 'held')}, and it renews it: a holder that is "
                "slow or cut off cannot be told from a dead one here. Released, it stops at "
                "its next guarded write, and a run stops within a tenth of the lease; to "
                f"release it anyway: stateops lock release {args.query} --force"
            )
        held, state = force_release(path, hold=args.hold), "released"
        kept = None if args.hold else read_hold(path)
        if kept is not None:  # said after the release line: the next step waits for it
            print(
                f"{describe_lock(name, kept, 'hold')}: kept (a run of another operation waits "
                f"for it); to drop it too: stateops lock release {args.query} --hold",
                file=sys.stderr,
            )
    else:
        held = read_lock(path)
        state = None if held is None else lock_state(held)
        if held is None and (held := read_hold(path)) is not None:
            state = "hold"
    if args.json:
        print(
            json.dumps(
                {
                    "query": args.query,
                    "state": state,
                    "lock": None if held is None else asdict(held),
                }
            )
        )
        return 0
    print(f"{args.query}: not locked" if held is None else describe_lock(name, held, state))
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from stateops.control.target import resolve_target

    path = resolve_target(args.checkpoint, args.registry).checkpoint
    if not audit_dir(path).is_dir():  # a checkpoint restored elsewhere keeps its log here
        require_checkpoint_dir(path)
    for record in read_audit(path):
        before, after = record["batch_before"], record["batch_after"]
        batch = f"batch {after}" if before == after else f"batch {before} -> {after}"
        print(
            json.dumps(record, sort_keys=True)
            if args.json
            else f"{record['time']}  {record['operation']:<10} {record['result']:<10} "
            f"{batch}  run {record['run_id']}"
        )
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from stateops.core.steps import RUN

    # The job's preflight refuses an unknown query (and the rest) before a JVM starts.
    fields = {"query": args.query, "mode": args.mode, "run_id": args.run_id}
    return _spark_submit(RUN, fields, args.master, args.registry)


def cmd_stop(args: argparse.Namespace) -> int:
    from stateops.control.lock import live_lock
    from stateops.control.markers import request_stop
    from stateops.control.target import query_target

    target = query_target(args.registry, args.query)
    held = live_lock(target.lock_file)
    if held is None:
        print(f"{target.name}: no run holds its lease (see stateops status): nothing to stop")
        return 0
    if held.operation != "run":
        raise StateOpsError(
            f"{target.name} is locked by {held.operation} (run {held.run_id}), not by a run of "
            "the query: it ends by itself; nothing to stop"
        )
    marker = request_stop(target.require_registry(), target.name, held)
    print(
        f"stop requested of run {held.run_id} ({held.owner}): {marker} (it stops after its "
        "current batch)"
    )
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


TARGET = "checkpoint directory, or a registered query's name"
REGISTRY_HELP = "registry file (default: STATEOPS_REGISTRY or registry.yaml)"


def _flag(p: argparse.ArgumentParser, name: str, help: str) -> None:
    p.add_argument(name, action="store_true", help=help)


def _master(p: argparse.ArgumentParser) -> None:
    p.add_argument("--master", default="local[2]", help="Spark master (default: local[2])")


def _checkpoint_commands(sub: Any) -> None:
    """Read-only looks at a checkpoint, and its state export."""
    p = sub.add_parser("inspect", help="what a checkpoint holds and what a restart needs")
    p.add_argument("checkpoint", help=TARGET)
    _flag(p, "--json", "machine-readable output")
    p.add_argument(
        "--files-for-batch",
        type=int,
        metavar="N",
        help="files a restart after committed batch N needs",
    )
    p.add_argument(
        "--min-deltas-for-snapshot",
        type=_positive,
        metavar="K",
        help="for group ids (default: registry's, or 10)",
    )
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser(
        "verify", help="file-level integrity: exit 0 sound, 1 with errors (each names a file)"
    )
    p.add_argument("checkpoint", help=TARGET)
    _flag(p, "--json", "machine-readable output")
    _flag(p, "--data", "then Great Expectations on the state (a QUERY; Spark)")
    _master(p)
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("export", help="state at a committed batch as Parquet + manifest (Spark)")
    p.add_argument("checkpoint", help=TARGET)
    p.add_argument("--out", required=True, help="a new or empty folder, or S3 prefix")
    p.add_argument("--batch", type=int, help="a committed batch (default: the last)")
    _master(p)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("audit", help="a checkpoint's audit log")
    p.add_argument("checkpoint", help=TARGET)
    _flag(p, "--json", "machine-readable output")
    p.set_defaults(func=cmd_audit)


def _backup_commands(sub: Any, s3_conn: argparse.ArgumentParser) -> None:
    """Backups on S3 and their restore."""
    p = sub.add_parser(
        "backup", parents=[s3_conn], help="upload the restart set of a committed batch to S3"
    )
    p.add_argument("checkpoint", help=TARGET)
    p.add_argument("--to", help="s3://BUCKET/PREFIX (default: the registry's backups.url/QUERY)")
    p.add_argument("--batch", type=int, help="a committed batch (default: the last)")
    p.set_defaults(func=cmd_backup)

    p = sub.add_parser(
        "restore",
        parents=[s3_conn],
        help="restore a backup: into a new folder, or over a query's checkpoint under its lock",
    )
    p.add_argument("source", help="a registered query's name, or s3://BUCKET/PREFIX/BACKUP_ID")
    p.add_argument(
        "--backup", metavar="latest|ID", help="for a query: a backup id, or latest (the default)"
    )
    p.add_argument("--to", help="target folder (default for a query: its checkpoint)")
    _flag(p, "--replace", "move a non-empty target aside")
    _flag(
        p,
        "--allow-other-query",
        "allow a backup of another query (another query id) over the target's state",
    )
    _flag(p, "--dry-run", "print the plan, change nothing")
    p.set_defaults(func=cmd_restore)

    p = sub.add_parser(
        "drill",
        parents=[s3_conn],
        help="restore drill: a backup restored into a scratch place, its state read (Spark)",
    )
    p.add_argument("query", help="a registered query's name")
    p.add_argument("--backup", default="latest", metavar="latest|ID", help="default: latest")
    _master(p)
    p.set_defaults(func=cmd_drill)

    backups = sub.add_parser("backups", help="list backups, verify one, or apply retention")
    actions = backups.add_subparsers(dest="action", required=True)
    where = "a registered query's name (its backups.url) or s3://BUCKET/PREFIX"
    p = actions.add_parser(
        "list", parents=[s3_conn], help="the backups under a query's backups.url (or URL)"
    )
    p.add_argument("url", metavar="QUERY|URL", help=where)
    _flag(p, "--json", "machine-readable output")
    p = actions.add_parser("verify", parents=[s3_conn], help="check one backup's objects")
    p.add_argument("url", metavar="URL", help="s3://BUCKET/PREFIX/BACKUP_ID")
    _flag(p, "--json", "machine-readable output")
    p = actions.add_parser("prune", parents=[s3_conn], help="apply retention")
    p.add_argument("url", metavar="QUERY|URL", help=where)
    p.add_argument("--keep-last", type=int, help="keep the newest K backups")
    p.add_argument("--max-age", help="keep backups younger than this (30d, 12h)")
    p.add_argument("--grace", default="1h", help="keep unreferenced objects this young")
    _flag(p, "--dry-run", "print the plan, delete nothing")
    backups.set_defaults(func=cmd_backups)


def _deletion_commands(sub: Any, s3_conn: argparse.ArgumentParser) -> None:
    """Cleanup and rollback, and the backfill that rolls back and reprocesses."""
    p = sub.add_parser(
        "cleanup", help="delete snapshot groups and log entries no retained restart needs"
    )
    p.add_argument("checkpoint", help=TARGET)
    p.add_argument(
        "--retain-batches",
        type=_positive,
        metavar="K",
        help="keep what restarts after each of the last K committed batches need (default: "
        "the registry's cleanup.retain_batches)",
    )
    _flag(p, "--dry-run", "print the plan, delete nothing")
    _flag(p, "--json", "the plan as JSON on stdout")
    p.set_defaults(func=cmd_cleanup)

    p = sub.add_parser(
        "rollback", parents=[s3_conn], help="make committed batch N the last one (backup first)"
    )
    p.add_argument("checkpoint", help=TARGET)
    p.add_argument("--to-batch", type=int, required=True, metavar="N")
    _flag(p, "--dry-run", "print the plan, change nothing")
    _flag(p, "--no-backup", "skip the backup (not advised)")
    p.add_argument("--backup-to", help="s3://BUCKET/PREFIX (default: the registry's)")
    p.add_argument(
        "--sink",
        help="the sink folder (batch_id=K folders) to make consistent (default: the registry's)",
    )
    _rewrite_output(p)
    _flag(p, "--json", "the plan as JSON on stdout")
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser(
        "repartition",
        parents=[s3_conn],
        help="change the number of state partitions of a stopped query (backup first)",
    )
    p.add_argument("checkpoint", help=TARGET)
    p.add_argument(
        "--partitions",
        type=int,
        required=True,
        metavar="N",
        help="the new number of state partitions",
    )
    _flag(p, "--dry-run", "print the plan, change nothing")
    _flag(p, "--no-backup", "skip the backup (not advised)")
    p.add_argument("--backup-to", help="s3://BUCKET/PREFIX (default: the registry's)")
    _flag(p, "--json", "the plan or the result as JSON on stdout")
    _master(p)
    p.set_defaults(func=cmd_repartition)

    p = sub.add_parser(
        "backfill",
        parents=[s3_conn],
        help="roll a query back and reprocess (the stream_backfill steps; backup first)",
    )
    p.add_argument("query")
    point = p.add_mutually_exclusive_group(required=True)
    point.add_argument("--to-batch", type=int, metavar="N", help="the last batch to keep")
    point.add_argument(
        "--input-before",
        metavar="TIME",
        help="roll back to the last batch whose input files were all modified before TIME",
    )
    p.add_argument(
        "--overrides",
        type=_overrides,
        default={},
        metavar="JSON",
        help="merged into the query's registry entry for the reprocessing (processor, "
        "watermark, expectations, spark_conf)",
    )
    _rewrite_output(p)
    _flag(p, "--dry-run", "print the plan, change nothing")
    _flag(p, "--json", "the plan or the result as JSON")
    _master(p)
    p.set_defaults(func=cmd_backfill)


def _rewrite_output(p: argparse.ArgumentParser) -> None:
    """The confirmation a rollback or backfill of a query with a Kafka sink waits for."""
    p.add_argument(
        "--rewrite-output",
        type=int,
        metavar="N",
        help="with a Kafka sink (at least once): confirm that the reprocessing writes again the "
        "N records the rolled-back batches wrote (the plan says N)",
    )


def _carry_over_commands(sub: Any, s3_conn: argparse.ArgumentParser) -> None:
    """State carried to a new checkpoint: bootstrap, transplant, migration."""
    accept = (
        "carry the state over even where the initialState road changes what the query "
        "computes (the refusal lists how)"
    )
    p = sub.add_parser("bootstrap", help="start a query on a new checkpoint with initial state")
    p.add_argument("query")
    p.add_argument("--initial-state", required=True, help="an export, a checkpoint, or files")
    p.add_argument("--format", choices=FORMATS, help="default: export if it has a manifest")
    p.add_argument(
        "--carry-over",
        choices=ROADS,
        default="auto",
        help="from a checkpoint: transplant its state files, or export it",
    )
    _flag(p, "--accept-differences", accept)
    _flag(p, "--dry-run", "print what it would do")
    _master(p)
    p.set_defaults(func=cmd_bootstrap)

    p = sub.add_parser(
        "transplant", help="a new checkpoint from an old one's state files, for a new source"
    )
    p.add_argument("old", help="the old checkpoint directory, or a registered query's name")
    p.add_argument("new", help="a new or empty folder")
    p.add_argument("--query", help="the registered query that runs on it (default: OLD's)")
    p.add_argument("--source", help="which of the query's sources moves (default: its only one)")
    p.add_argument("--source-format", help="the new source's format (default: the query's)")
    p.add_argument("--source-path", help="the new source's folder (default: the query's)")
    p.add_argument("--source-topic", help="a Kafka source's topic (with --source-format kafka)")
    _brokers_arg(p, "--source-bootstrap-servers")
    p.add_argument(
        "--source-start",
        choices=KAFKA.starts,
        help="where a new Kafka source starts: at the offsets of --cutover TIME, the topic's "
        "beginning (earliest) or its end now (latest)",
    )
    p.add_argument("--cutover", help="a past time: where --source-start cutover starts")
    p.add_argument("--batch", type=int, help="the committed batch to carry (default: the last)")
    _flag(p, "--dry-run", "check and print the plan, write nothing")
    p.set_defaults(func=cmd_transplant)

    _migrate_command(sub, s3_conn, accept)


def _brokers_arg(p: argparse.ArgumentParser, flag: str) -> None:
    """A moved Kafka source's brokers, as transplant and migrate take them."""
    p.add_argument(
        flag,
        metavar="HOST:PORT",
        help="a Kafka source's brokers (default: the kafka_default connection or environment)",
    )


def _migrate_command(sub: Any, s3_conn: argparse.ArgumentParser, accept: str) -> None:
    """``stateops migrate``: a new source (a folder or a topic) with the state."""
    p = sub.add_parser(
        "migrate",
        parents=[s3_conn],
        help="move a query to a new source with its state (the stream_source_migration steps)",
    )
    p.add_argument("query")
    p.add_argument("--source", help="which of the query's sources moves (default: its only one)")
    p.add_argument(
        "--new-source-path",
        help="a file source's folder or a Delta table (relative to the registry's data_dir)",
    )
    p.add_argument(
        "--new-source-format",
        metavar="|".join(SOURCE_FORMATS),
        help="default: kafka with --new-source-topic, delta for a folder that holds a Delta "
        "table, else the format of the files in the new source's folder (by their first bytes)",
    )
    p.add_argument("--new-source-topic", help="a Kafka source's topic")
    _brokers_arg(p, "--new-source-bootstrap-servers")
    p.add_argument(
        "--new-source-start",
        choices=KAFKA.starts,
        default="cutover",
        help="where the new checkpoint starts a Kafka source: at the offsets of the cutover "
        "time (the drain's end with --cutover drain; default), the topic's beginning "
        "(earliest) or its end (latest)",
    )
    p.add_argument("--new-source-schema", help="DDL (default: the query's current schema)")
    p.add_argument(
        "--new-source-option",
        type=_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a reader option (repeat for more)",
    )
    p.add_argument(
        "--cutover",
        default="drain",
        help="drain (default), or a past time: the old source reads the files modified before "
        "it (a topic is read to its end), and a new Kafka source starts at its offsets",
    )
    p.add_argument("--new-checkpoint", help="a new or empty folder (default: <checkpoint>.v2)")
    p.add_argument(
        "--carry-over",
        choices=ROADS,
        default="auto",
        help="transplant the state files, or export + initialState (default: auto)",
    )
    _flag(p, "--accept-differences", accept)
    _flag(p, "--dry-run", "print the plan, change nothing")
    _master(p)
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser(
        "upgrade",
        parents=[s3_conn],
        help="check a query's new code against its checkpoint's state; rewrite the state "
        "where Spark cannot evolve it (docs/code-upgrades.md)",
    )
    p.add_argument("query")
    p.add_argument("--new-checkpoint", help="a new or empty folder (default: <checkpoint>.v2)")
    _flag(p, "--dry-run", "print the check and the plan, change nothing")
    _master(p)
    p.set_defaults(func=cmd_upgrade)

    p = sub.add_parser(
        "unretire",
        help="lift the hold of a migration's retired old checkpoint, or of a failed one's new "
        "checkpoint set aside (docs/migration-on-s3.md)",
    )
    p.add_argument("checkpoint", help=TARGET)
    p.set_defaults(func=cmd_unretire)


def _query_commands(sub: Any, s3_conn: argparse.ArgumentParser) -> None:
    """The registry's queries: list, health, runs, locks, sample data."""
    p = sub.add_parser("queries", help="validate the registry and list its queries")
    _flag(p, "--json", "machine-readable output")
    p.set_defaults(func=cmd_queries)

    p = sub.add_parser(
        "status",
        parents=[s3_conn],
        help="each query's state health: checkpoint, state, cleanup, backups, validation, lineage",
    )
    p.add_argument("query", nargs="?", help="one registered query (default: all)")
    _flag(p, "--json", "machine-readable output")
    _flag(p, "--no-backups", "do not list the backup store")
    p.add_argument(
        "--history",
        nargs="?",
        const=HISTORY_DEFAULT,
        metavar="DURATION",
        help="also the figures each run and health check recorded over the last DURATION "
        "(default 1 day; e.g. '7 days')",
    )
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("run", help="run a registered query under its lock (Spark)")
    p.add_argument("query")
    p.add_argument("--mode", choices=["available-now", "continuous"], default="available-now")
    p.add_argument(
        "--run-id",
        help="the run's id (default: a new one); a hold on the query admits its own run id "
        "(a killed backfill's reprocessing, as stateops status says)",
    )
    _master(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "stop", help="ask a continuously running query to stop after its current batch"
    )
    p.add_argument("query")
    p.set_defaults(func=cmd_stop)

    lock = sub.add_parser("lock", help="show or force-release a query's lifecycle lock")
    actions = lock.add_subparsers(dest="action", required=True)
    p = actions.add_parser("show", help="who holds the query's lock, and until when")
    p.add_argument("query")
    _flag(p, "--json", "machine-readable output")
    p = actions.add_parser("release", help="force-release it (its holder is gone)")
    p.add_argument("query")
    _flag(p, "--force", "release a live lock too (its holder stops at its next guarded write)")
    _flag(p, "--hold", "drop the hold too (a migration's or backfill's, kept between its steps)")
    lock.set_defaults(func=cmd_lock, json=False, force=False)

    p = sub.add_parser(
        "generate", help="write deterministic sample events for both reference pipelines"
    )
    p.add_argument(
        "--out", help="write to OUT/<dataset> (default: each registered query's source.path)"
    )
    p.add_argument("--events", type=_positive, default=250, help="events per file")
    p.add_argument("--users", type=_positive, default=50)
    p.add_argument("--files", type=_positive, default=4)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--round", type=int, default=0, help="later rounds hold later event times")
    p.add_argument("--initial-pages", metavar="FILE", help="also write a page_visits initial state")
    p.set_defaults(func=cmd_generate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stateops",
        description="Lifecycle operations for Spark streaming state.",
        epilog="Exit codes: 0 done; 1 a finding (verify: errors; status: a part it could not "
        "read, or a FAIL verdict); 2 refused or bad input (one line on stderr, nothing "
        "changed); 141 the reader of the output went away (stateops status --json | head).",
    )
    parser.add_argument("--version", action="version", version=f"stateops {__version__}")
    parser.add_argument("--registry", help=REGISTRY_HELP)
    sub = parser.add_subparsers(dest="command", required=True)
    s3_conn = argparse.ArgumentParser(add_help=False)
    s3_conn.add_argument(
        "--conn-id", help="Airflow aws connection (AIRFLOW_CONN_<ID>); default: the environment"
    )
    _checkpoint_commands(sub)
    _backup_commands(sub, s3_conn)
    _deletion_commands(sub, s3_conn)
    _carry_over_commands(sub, s3_conn)
    _query_commands(sub, s3_conn)
    for command in _commands(parser).values():  # a global option after the command too
        command.add_argument("--registry", default=argparse.SUPPRESS, help=REGISTRY_HELP)
    return parser


def _commands(parser: argparse.ArgumentParser) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every command's parser by its words: ('cleanup',), ('backups', 'list'), ..."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                found.update(
                    {(name, *k): v for k, v in _commands(command).items()} or {(name,): command}
                )
    return found


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    use_connections(getattr(args, "registry", None))
    return reported(lambda: args.func(args))


def reported(command: Callable[[], int]) -> int:
    """``command``'s exit code, a command's error said as the CLI says it: one line ``error:
    ...`` on stderr, exit code 1 for an operation that failed, 2 for a refusal."""
    try:
        with domain_errors():
            return command()
    except StateOpsError as err:
        if isinstance(err.__cause__, BrokenPipeError) and _reader_gone():
            # `stateops status --json | head`: the reader took what it wanted; no error.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141  # as a shell reports a writer that SIGPIPE ended
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 1 if isinstance(err, OperationFailed) else 2


def _reader_gone() -> bool:
    """Whether standard output is a pipe whose reader has closed it."""
    import select

    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(main())
