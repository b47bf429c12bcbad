"""Backup and restore against a real S3 API (rclone serve s3) on Spark-written checkpoints."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from stateops import cli
from stateops.control.markers import rollback_marker
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import CheckpointError, StateOpsError
from stateops.core.registry import load_registry
from stateops.core.report import checkpoint_report
from stateops.core.verify import verify_checkpoint
from stateops.dev.s3server import free_port
from stateops.ops.backup import (
    backup_checkpoint,
    list_backups,
    prune_backups,
    verify_backup,
)
from stateops.ops.restore import restore_backup
from tests.conftest import (
    S3_SECRET,
    CliRow,
    S3Server,
    cli_table,
    paused_cli,
    run_cli,
    run_query_command,
    tree_digest,
    write_registry,
)
from tests.spark.harness import copy_checkpoint, land, read_state, run_in_session

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def checkpoint(spark, tmp_path_factory) -> tuple[Path, Path]:
    """(registry, checkpoint) of page_visits after two batches."""
    root = tmp_path_factory.mktemp("backup")
    registry = write_registry(root)
    land(root / "landing", round_=0, files=2)
    run_in_session(spark, registry, "page_visits")
    return registry, Path(load_registry(registry).query("page_visits").checkpoint)


def test_backups_are_incremental_and_restore_verified(spark, s3, checkpoint, tmp_path):
    registry, ckpt = checkpoint
    client = s3.client()
    to = "s3://backups/incremental"
    first = backup_checkpoint(ckpt, to, client, log=lambda _: None)
    cp = load_checkpoint(ckpt)
    assert first["batch_id"] == cp.last_committed_batch
    assert [f["path"] for f in first["files"]] == cp.restart_files(first["batch_id"])
    assert first["uploaded"]["bytes"] == first["bytes"] > 0

    again = backup_checkpoint(ckpt, to, client, log=lambda _: None)
    assert again["uploaded"] == {"objects": 0, "bytes": 0}
    audit = run_cli("audit", str(ckpt), check=True).stdout.splitlines()[-1]  # issue 40
    assert f" backup     succeeded  batch {first['batch_id']}  run {again['backup_id']}" in audit
    assert again["reused"] == {"files": len(again["files"]), "bytes": again["bytes"]}

    # One more batch: only the files it changed are uploaded.
    land(ckpt.parent.parent / "landing", round_=1, files=1)
    run_in_session(spark, registry, "page_visits")
    third = backup_checkpoint(ckpt, to, client, log=lambda _: None)
    assert third["batch_id"] == first["batch_id"] + 1
    known = {f["sha256"] for f in first["files"]}
    new = {f["sha256"]: f["size"] for f in third["files"] if f["sha256"] not in known}
    assert third["uploaded"] == {"objects": len(new), "bytes": sum(new.values())}
    assert 0 < third["uploaded"]["bytes"] < third["bytes"]
    print(f"incremental backup: {third['uploaded']} of {third['bytes']} bytes")

    assert [b["backup_id"] for b in list_backups(to, client)] == [
        first["backup_id"],
        again["backup_id"],
        third["backup_id"],
    ]
    assert verify_backup(f"{to}/{third['backup_id']}", client)["ok"]

    # Restore the first backup while the original moved on: batch and files as backed up.
    target = tmp_path / "restored"
    result = restore_backup(f"{to}/{first['backup_id']}", target, client, log=lambda _: None)
    assert result["batch_id"] == first["batch_id"] and result["moved_aside"] is None
    restored = load_checkpoint(target)
    assert restored.last_committed_batch == first["batch_id"]
    assert verify_checkpoint(target)["ok"]
    # transformWithState metadata names its schema files by absolute path: the restored
    # checkpoint's own, not the original's nor the staging folder's.
    metadata = [p for p in (target / "state/0/_metadata/v2").glob("*") if p.name[0] != "."]
    assert metadata and all(
        f"file:{target.resolve()}/state/0/_stateSchema/" in p.read_text()
        and str(ckpt) not in p.read_text()
        and ".restoring-" not in p.read_text()
        for p in metadata
    )

    # A non-empty target is refused; with replace it is moved aside, never deleted.
    with pytest.raises(StateOpsError, match="not empty"):
        restore_backup(f"{to}/{third['backup_id']}", target, client, log=lambda _: None)
    result = restore_backup(
        f"{to}/{third['backup_id']}", target, client, replace=True, log=lambda _: None
    )
    assert load_checkpoint(result["moved_aside"]).last_committed_batch == first["batch_id"]
    assert load_checkpoint(target).last_committed_batch == third["batch_id"]


def test_a_corrupted_object_is_named_and_restore_changes_nothing(s3, checkpoint, tmp_path):
    _, ckpt = checkpoint
    client = s3.client()
    backup = backup_checkpoint(ckpt, "s3://backups/corrupt", client, log=lambda _: None)
    url = f"s3://backups/corrupt/{backup['backup_id']}"
    victim = next(f for f in backup["files"] if f["path"].startswith("state/") and f["size"])
    obj = s3.root / "backups" / "corrupt" / "objects" / victim["sha256"]
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0xFF
    obj.write_bytes(bytes(data))
    report = verify_backup(url, client)
    assert not report["ok"] and report["problems"] == [
        f"s3://backups/corrupt/objects/{victim['sha256']}: content does not match its sha256"
    ]
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(StateOpsError, match=f"objects/{victim['sha256']} is corrupt"):
        restore_backup(url, tmp_path / "restored", client, log=lambda _: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "no staging folder left"


def test_a_damaged_state_file_is_refused_by_backup_and_export_changing_nothing(
    s3, checkpoint, tmp_path, monkeypatch
):
    """A flipped byte in a state file (its .crc sidecar disagrees): verify reports it, and so
    do backup and export, before they write anything; a backup taken of it before this check
    is named by `backups verify` (restore would refuse it)."""
    from stateops.ops import backup as backup_module

    registry, ckpt = checkpoint
    damaged = copy_checkpoint(ckpt, tmp_path / "damaged")
    cp = load_checkpoint(damaged)
    victim = next(
        rel
        for rel in cp.restart_files(cp.last_committed_batch)
        if rel.startswith("state/")
        and cp.sizes[rel]
        and f"{Path(rel).parent}/.{Path(rel).name}.crc" in cp.sizes
    )
    data = bytearray((damaged / victim).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (damaged / victim).write_bytes(bytes(data))
    assert any(f["path"] == victim for f in verify_checkpoint(damaged)["findings"])
    before, client = tree_digest(damaged), s3.client()

    with pytest.raises(CheckpointError, match=f"^backup of .*: {victim} is damaged \\(checksum"):
        backup_checkpoint(damaged, "s3://backups/damaged", client, log=lambda _: None)
    assert not (s3.root / "backups" / "damaged").exists()
    out = tmp_path / "export"
    refused = run_cli("export", str(damaged), "--out", str(out))
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith(f"error: export of {damaged}: {victim} is damaged")
    assert len(refused.stderr.splitlines()) == 1 and not out.exists()
    assert tree_digest(damaged) == before

    # A backup of it taken without the check (as before it existed): named by its verify.
    monkeypatch.setattr(backup_module, "refuse_damaged", lambda *args: None)
    taken = backup_checkpoint(damaged, "s3://backups/damaged", client, log=lambda _: None)
    report = verify_backup(f"s3://backups/damaged/{taken['backup_id']}", client)
    (problem,) = report["problems"]
    assert not report["ok"] and problem.startswith(f"{victim}: checksum mismatch in bytes ")
    assert problem.endswith("(it was damaged when it was backed up)")


def test_manifest_paths_that_escape_the_target_are_refused(s3, tmp_path):
    client = s3.client()
    manifest = {
        "format": "stateops-backup/1",
        "backup_id": "b-000001-evil",
        "batch_id": 1,
        "query_id": "x",
        "created_at": "2026-01-01T00:00:00+00:00",
        "bytes": 1,
        "source": "/elsewhere",
        "files": [{"path": "../outside", "size": 1, "sha256": "0" * 64}],
    }
    client.put_object(
        Bucket="backups", Key="evil/manifests/b-000001-evil.json", Body=json.dumps(manifest)
    )
    target = tmp_path / "inside" / "restored"
    target.parent.mkdir()
    with pytest.raises(StateOpsError, match=r"'../outside' escapes the restore target"):
        restore_backup("s3://backups/evil/b-000001-evil", target, client, log=lambda _: None)
    assert list(tmp_path.rglob("*")) == [tmp_path / "inside"]


def test_wrong_credentials_are_one_line_without_the_secret(s3, checkpoint):
    _, ckpt = checkpoint
    env = {**s3.env(), "AWS_SECRET_ACCESS_KEY": "wrong-" + S3_SECRET}
    before = tree_digest(ckpt)
    proc = run_cli("backup", str(ckpt), "--to", "s3://backups/creds", env=env)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: S3 backup to s3://backups/creds: SignatureDoesNotMatch: "
        "check the secret key of the S3 connection"
    ]
    assert S3_SECRET not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
    assert tree_digest(ckpt) == before


def test_endpoint_down_mid_backup_leaves_no_backup_and_a_later_one_reuses_the_uploads(
    checkpoint, tmp_path
):
    _, ckpt = checkpoint
    cp = load_checkpoint(ckpt)
    files = [ckpt / rel for rel in cp.restart_files(cp.last_committed_batch)]
    digests = {p: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_size) for p in files}
    needed = set(digests.values())
    server = S3Server(tmp_path / "s3", free_port())
    server.start()
    try:
        client = server.client()
        puts = []

        def kill_after_some_uploads(http_response, **_) -> None:
            puts.append(http_response.status_code)
            if len(puts) >= 5:
                server.proc.kill()  # kill -9 while the transfer manager is uploading

        client.meta.events.register("after-call.s3.PutObject", kill_after_some_uploads)
        with pytest.raises(StateOpsError, match="S3 backup to s3://backups/down: "):
            backup_checkpoint(ckpt, "s3://backups/down", client, log=lambda _: None)
        client.meta.events.unregister("after-call.s3.PutObject", kill_after_some_uploads)
        server.proc.wait()
        server.start()

        assert list_backups("s3://backups/down", client) == []  # no manifest: no backup
        listing = client.list_objects_v2(Bucket="backups", Prefix="down/objects/")["Contents"]
        there = {(o["Key"].rpartition("/")[2], o["Size"]) for o in listing}
        assert 5 <= len(there & needed) < len(needed)  # partly uploaded
        # A store killed mid-write can keep a stub under the object's name: not reused.
        stub = next(p for p in files if digests[p][1] > 10 and digests[p] not in there)
        sha = digests[stub][0]
        client.put_object(Bucket="backups", Key=f"down/objects/{sha}", Body=stub.read_bytes()[:10])
        there.add((sha, 10))
        later = backup_checkpoint(ckpt, "s3://backups/down", client, log=lambda _: None)
        assert later["uploaded"]["objects"] == len(needed - there)  # only the rest
        assert later["reused"]["files"] >= 5
        assert verify_backup(f"s3://backups/down/{later['backup_id']}", client)["ok"]
    finally:
        server.stop()


def _old_and_new(spark, checkpoint, client, to: str) -> tuple[dict, dict, set[str]]:
    """Backups of the last batch but one and of the last, and the objects only the first names
    (after the fixture's first two batches their restart sets overlap: one more batch first,
    whichever test of this module runs first)."""
    registry, ckpt = checkpoint
    if load_checkpoint(ckpt).last_committed_batch < 2:
        land(ckpt.parent.parent / "landing", round_=9, files=1)
        run_in_session(spark, registry, "page_visits")
    last = load_checkpoint(ckpt).last_committed_batch
    old = backup_checkpoint(ckpt, to, client, batch=last - 1, log=lambda _: None)
    new = backup_checkpoint(ckpt, to, client, batch=last, log=lambda _: None)
    only_old = {f["sha256"] for f in old["files"]} - {f["sha256"] for f in new["files"]}
    assert only_old, "batches differ in some state files"
    return old, new, only_old


def test_retention_deletes_old_manifests_first_and_only_unreferenced_objects(spark, s3, checkpoint):
    client = s3.client()
    to = "s3://backups/retention"
    old, new, only_old = _old_and_new(spark, checkpoint, client, to)
    objects = s3.root / "backups" / "retention" / "objects"
    before = tree_digest(s3.root)

    plan = prune_backups(to, client, keep_last=1, grace="0s", dry_run=True)
    assert plan["deleted_backups"] == [old["backup_id"]] and plan["kept"] == [new["backup_id"]]
    assert plan["deleted_objects"] == len(only_old)
    assert tree_digest(s3.root) == before, "a dry run deletes nothing"
    # Young unreferenced objects are kept: a running backup may be about to name them.
    assert prune_backups(to, client, keep_last=1, dry_run=True)["deleted_objects"] == 0

    done = prune_backups(to, client, keep_last=1, grace="0s")
    assert done["deleted_backups"] == [old["backup_id"]]
    assert [b["backup_id"] for b in list_backups(to, client)] == [new["backup_id"]]
    assert not any((objects / sha).exists() for sha in only_old)
    assert verify_backup(f"{to}/{new['backup_id']}", client)["ok"]


def test_a_prune_puts_back_the_objects_a_backup_beside_it_reused(spark, s3, checkpoint, tmp_path):
    """The prune stalls after it read the manifests (the old backup is dropped, its own objects
    unreferenced); a backup of the old batch reuses them and ends; the prune goes on."""
    _, ckpt = checkpoint
    client = s3.client()
    to = "s3://backups/prune-beside-a-backup"
    old, new, only_old = _old_and_new(spark, checkpoint, client, to)
    with paused_cli(
        *("backups", "prune", to, "--keep-last", "1", "--grace", "0s"),
        at="prune:1",
        trace=tmp_path / "trace",
        env=s3.env(),
    ) as prune:
        again = backup_checkpoint(ckpt, to, client, batch=old["batch_id"], log=lambda _: None)
        assert again["uploaded"]["objects"] == 0, "it reuses every object of the old backup"
        pruned = prune.resume(timeout=60)
    assert pruned.returncode == 0, pruned.stderr
    assert f"put back {len(only_old)} objects a backup taken meanwhile names" in pruned.stdout
    listed = [b["backup_id"] for b in list_backups(to, client)]
    assert listed == [new["backup_id"], again["backup_id"]]
    assert verify_backup(f"{to}/{again['backup_id']}", client)["ok"]

    # A prune killed between its moves and its second read leaves a named object in trash/
    # only: the next prune puts it back before it empties the trash.
    sha = sorted(only_old)[0]
    key = f"prune-beside-a-backup/objects/{sha}"
    client.copy_object(
        CopySource={"Bucket": "backups", "Key": key},
        Bucket="backups",
        Key=key.replace("objects/", "trash/") + ".killed",
    )
    client.delete_object(Bucket="backups", Key=key)
    assert not verify_backup(f"{to}/{again['backup_id']}", client)["ok"]
    assert prune_backups(to, client, keep_last=2, grace="0s")["put_back"] == 1
    assert verify_backup(f"{to}/{again['backup_id']}", client)["ok"]


def test_a_backup_puts_back_the_objects_a_prune_beside_it_set_aside(
    spark, s3, checkpoint, tmp_path
):
    """The backup stalls with its objects listed and its manifest not yet written; a prune
    sets aside the objects the backup reuses; the backup goes on, writes its manifest and
    finds them gone. A later prune deletes the trash for good and keeps what is named."""
    _, ckpt = checkpoint
    client = s3.client()
    to = "s3://backups/backup-beside-a-prune"
    old, new, only_old = _old_and_new(spark, checkpoint, client, to)
    with paused_cli(
        *("backup", str(ckpt), "--to", to, "--batch", str(old["batch_id"])),
        at="manifest:1",
        trace=tmp_path / "trace",
        env=s3.env(),
    ) as backup:
        pruned = prune_backups(to, client, keep_last=1, grace="0s")
        assert pruned["deleted_objects"] == len(only_old) and pruned["put_back"] == 0
        backed_up = backup.resume(timeout=60)
    assert backed_up.returncode == 0, backed_up.stderr
    assert f"{len(only_old)} objects a prune beside it had set aside were put back" in (
        backed_up.stderr
    )
    latest = list_backups(to, client)[-1]
    assert latest["batch_id"] == old["batch_id"]
    assert verify_backup(f"{to}/{latest['backup_id']}", client)["ok"]

    def trash() -> int:
        listing = client.list_objects_v2(Bucket="backups", Prefix="backup-beside-a-prune/trash/")
        return len(listing.get("Contents", []))

    assert trash() == len(only_old)
    assert prune_backups(to, client, keep_last=2, grace="0s")["deleted_objects"] == 0
    assert trash() == 0, "the trash older than the grace is deleted for good"
    for b in list_backups(to, client):
        assert verify_backup(f"{to}/{b['backup_id']}", client)["ok"]


@pytest.mark.whole
def test_backups_taken_while_the_query_runs_restore_and_restart(spark, s3, tmp_path):
    registry = write_registry(tmp_path, page_visits={"trigger": {"processing_time": "1 second"}})
    query = load_registry(registry).query("page_visits")
    ckpt, client, to = Path(query.checkpoint), s3.client(), "s3://backups/running"
    land(tmp_path / "landing", round_=0, files=1)
    cmd = run_query_command(registry, "page_visits", "--mode", "continuous")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    backups: list[dict] = []
    try:
        deadline = time.time() + 240
        for round_ in range(1, 5):  # input keeps landing; a backup after each new commit
            while time.time() < deadline:
                try:
                    if load_checkpoint(ckpt).last_committed_batch == round_ - 1:
                        break
                except StateOpsError:
                    pass  # no checkpoint yet
                time.sleep(0.5)
            land(tmp_path / "landing", round_=round_, files=1)
            backups.append(backup_checkpoint(ckpt, to, client, log=lambda _: None))
        assert proc.poll() is None, "the query kept running during the backups"
        run_cli("--registry", str(registry), "stop", "page_visits", check=True)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [b["batch_id"] for b in backups] == [0, 1, 2, 3]
    assert all(verify_backup(f"{to}/{b['backup_id']}", client)["ok"] for b in backups)

    # The original finishes the landed input; the restored backup of batch 1, restarted on the
    # same input, ends with the same state.
    run_in_session(spark, registry, "page_visits")
    restored = tmp_path / "restored"
    restore_backup(f"{to}/{backups[1]['backup_id']}", restored, client, log=lambda _: None)
    raw = yaml.safe_load(registry.read_text())
    raw["queries"]["page_visits"]["checkpoint"] = str(restored)
    raw["queries"]["page_visits"]["sink"]["path"] = str(tmp_path / "output-restored")
    other = tmp_path / "registry-restored.yaml"
    other.write_text(yaml.safe_dump(raw, sort_keys=False))
    run_in_session(spark, other, "page_visits")
    reads = [{"stateVarName": "pages"}, {"stateVarName": "count"}]
    assert (
        load_checkpoint(restored).last_committed_batch == load_checkpoint(ckpt).last_committed_batch
    )
    assert read_state(spark, restored, reads) == read_state(spark, ckpt, reads)


def test_status_shows_checkpoint_state_and_backups_and_says_what_it_cannot_read(s3, checkpoint):
    """`stateops status` (what the Airflow "Streaming state" view shows) on a Spark-written
    checkpoint with a backup; read-only: the checkpoint is byte-identical after it."""
    registry, ckpt = checkpoint
    url = "s3://backups/status"
    raw = yaml.safe_load(registry.read_text())
    registry.write_text(yaml.safe_dump(raw | {"backups": {"url": url}}, sort_keys=False))
    # By the query's name, to the registry's backups.url/<query>.
    taken = json.loads(
        run_cli(
            "--registry", str(registry), "backup", "page_visits", env=s3.env(), check=True
        ).stdout
    )
    before = tree_digest(ckpt)
    cli = ("--registry", str(registry), "status", "page_visits")

    [status] = json.loads(run_cli(*cli, "--json", env=s3.env(), check=True).stdout)
    cp = load_checkpoint(ckpt)
    assert (status["checkpoint"], status["sources"]["source"]["format"]) == (str(ckpt), "json")
    assert status["last_committed_batch"] == cp.last_committed_batch and status["committed_at"]
    [op] = status["operators"]
    assert op["bytes"] == sum(s for rel, s in cp.sizes.items() if rel.startswith("state/0/"))
    assert op["snapshot_groups"] and sum(g["bytes"] for g in op["snapshot_groups"]) <= op["bytes"]
    # The groups as the checkpoint model and the cleanup count them, by the query's own K.
    k = load_registry(registry).query("page_visits").state_store.min_deltas_for_snapshot
    [model] = checkpoint_report(cp, k)["operators"]
    assert [g["group_id"] for g in op["snapshot_groups"]] == [
        g["group_id"] for g in model["snapshot_groups"]
    ], op["snapshot_groups"]  # several groups: tests/e2e/test_airflow.py
    assert [(b["backup_id"], b["batch_id"]) for b in status["backups"]] == [
        (taken["backup_id"], taken["batch_id"])
    ]
    assert status["errors"] == [] and status["last_run"]["status"] == "succeeded"
    assert status["health"] == {"verdict": "OK", "reasons": [], "findings": []}

    text = run_cli(*cli, env=s3.env(), check=True).stdout
    assert f"last committed  batch {cp.last_committed_batch} at " in text, text
    listed = run_cli(
        "--registry",
        str(registry),
        "backups",
        "list",
        "page_visits",
        "--json",
        env=s3.env(),
        check=True,
    ).stdout
    assert [b["backup_id"] for b in json.loads(listed)] == [taken["backup_id"]], "by its name"
    assert f"{taken['backup_id']}  batch {taken['batch_id']}" in text, text

    # The backup store refuses: said, the rest is still shown, and the exit code says that a
    # part is unknown (1).
    secret = "not-the-secret-7f3a"
    wrong = run_cli(*cli, "--json", env={**s3.env(), "AWS_SECRET_ACCESS_KEY": secret})
    [partial] = json.loads(wrong.stdout)
    assert wrong.returncode == 1 and partial["last_committed_batch"] == cp.last_committed_batch
    assert len(partial["errors"]) == 1 and partial["errors"][0].startswith("backups: ")
    assert secret not in wrong.stdout + wrong.stderr, "never the secret"
    text = run_cli(*cli, env={**s3.env(), "AWS_SECRET_ACCESS_KEY": secret})
    assert text.returncode == 1 and "  backups         unknown (the error below)" in text.stdout
    assert "  backups         0" not in text.stdout and "  error: backups: " in text.stdout

    # Input that landed two hours ago and was not read: WARN, saying so; exit 0.
    landing = Path(load_registry(registry).query("page_visits").source.path)
    waiting = landing / "late-arrival.json"
    waiting.write_text('{"user_id": "u1", "page": "/", "event_time": "2026-01-01T00:00:00Z"}\n')
    two_hours_ago = time.time() - 7200
    os.utime(waiting, (two_hours_ago, two_hours_ago))
    warned = run_cli(*cli, "--no-backups")
    assert warned.returncode == 0 and warned.stdout.startswith("page_visits: WARN "), warned
    assert (
        "  WARN            1 input file of source landed and not read, the oldest 2 h "
        "ago (allowed: 60 min, health.input_waiting); stateops run page_visits reads them"
    ) in warned.stdout
    # An interrupted rollback: the query refuses to start: FAIL, exit 1.
    marker = rollback_marker(ckpt)
    marker.write_text(json.dumps({"to_batch": 0, "run_id": "r-test", "backup_id": None}))
    failed = run_cli(*cli, "--no-backups", "--json")
    [status] = json.loads(failed.stdout)
    assert failed.returncode == 1 and status["health"]["verdict"] == "FAIL", failed
    assert status["health"]["reasons"][0].startswith("a rollback was interrupted")
    marker.unlink()
    waiting.unlink()

    unknown = run_cli("--registry", str(registry), "status", "no_such_query")
    assert unknown.returncode == 2 and len(unknown.stderr.strip().splitlines()) == 1
    assert "no_such_query" in unknown.stderr, unknown.stderr
    assert tree_digest(ckpt) == before


def _walk_argv(row: CliRow, name: str, values: dict[str, str]) -> list[str]:
    """The row's synopsis with its optional parts left out (not a query's name) and each
    placeholder given a value (``QUERY...`` the name), then ``--dry-run`` and ``--json``
    where the row has them."""
    argv, optional = [], False
    for word in row.words:
        optional = optional or word.startswith("[")
        if word.strip("[]").startswith("QUERY"):
            argv.append(name)
        elif not optional:
            argv.append(values.get(word, word))
        optional = optional and not word.endswith("]")
    return argv + ["--dry-run"] * row.dry_run + ["--json"] * (row.json == "yes")


def _new_source(folder: Path) -> Path:
    """A parquet source with one page_visits event."""
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    event = {"user_id": ["u1"], "page": ["/home"], "event_time": [datetime.datetime(2026, 1, 1)]}
    pq.write_table(pa.table(event), folder / "part-0.parquet")
    return folder


def _json_documents(text: str) -> list:
    try:
        return [json.loads(text)]
    except ValueError:
        return [json.loads(line) for line in text.splitlines()]


def _pick(doc: dict, *keys: str) -> tuple:
    return tuple(doc[k] for k in keys)


def _says(command: tuple[str, ...], argv: list[str], out: str, err: str, cp, values) -> None:
    """What a walked command's output says about the walk's checkpoint ``cp`` (page_visits on
    RocksDB, 2 partitions, backed up once by the walk to its own location): more than "exit 0
    and JSON", for every row."""
    doc = _json_documents(out)[0] if out.lstrip().startswith(("{", "[")) else None
    last, ckpt, qid = cp.last_committed_batch, str(cp.root), cp.query_id
    location = "s3://backups/walk/page_visits"
    backup_id = values.get("URL", "").rsplit("/", 1)[-1]
    what = (command, argv, out[-2000:], err[-2000:])
    got: tuple = ()
    want: tuple = ()
    match command:
        case ("inspect",):
            [op] = doc["operators"]
            got = _pick(doc, "checkpoint", "query_id", "last_committed_batch") + _pick(
                op, "provider", "num_partitions"
            )
            want = ckpt, qid, last, "rocksdb", 2
        case ("verify",):
            got = doc["checkpoint"], doc["ok"], doc["errors"], doc["last_committed_batch"]
            want = ckpt, True, 0, last
        case ("audit",):  # among its records (backups too), the run that committed the last batch
            records = [json.loads(line) for line in out.splitlines()]
            runs = [_pick(r, "operation", "result", "batch_after") for r in records]
            got = (("run", "succeeded", last) in runs,)
            want = (True,)
        case ("backup",):
            got = doc["query_id"], doc["batch_id"], doc["provider"], f"to {location}" in err
            want = qid, last, "rocksdb", True
        case ("restore",):
            got = _pick(doc, "url", "target", "target_contents", "replace") + (
                doc["backup"]["batch_id"],
                os.listdir(values["FOLDER"]),
            )
            want = values["URL"], values["FOLDER"], "none", False, last, []
        case ("backups", "list"):
            got = ([(b["backup_id"], b["batch_id"], b["query_id"]) for b in doc],)
            want = ([(backup_id, last, qid)],)
        case ("backups", "verify"):
            got = doc["backup_id"], doc["ok"], doc["problems"], doc["objects"] > 0
            want = backup_id, True, [], True
        case ("backups", "prune"):
            got = f"keeps 1 backups: {backup_id}" in out, "would delete 0 backups" in out
            want = True, True
        case ("cleanup",):  # the registry's retain_batches; no more batches than that
            kept = sorted(cp.commits)[-10:]  # retained: [first, last]
            got = doc["checkpoint"], doc["retain_batches"], doc["retained"], doc["delete"]["files"]
            want = ckpt, 10, [kept[0], kept[-1]], 0
        case ("rollback",):
            files = set(doc["files"]["after-rollback-point"])
            later = {f"commits/{last}", f"offsets/{last}"} <= files
            got = _pick(doc, "checkpoint", "last_committed_batch", "to_batch", "backup_to") + (
                later,
                sorted(doc["sink"]["folders"]),
            )
            want = ckpt, last, 0, location, True, [f"batch_id={b}" for b in range(1, last + 1)]
        case ("repartition",):
            got = _pick(doc, "checkpoint", "partitions_before", "partitions", "batch", "backup_to")
            want = ckpt, 2, 3, last + 1, location
        case ("backfill",):
            got = _pick(doc, "query", "checkpoint", "to_batch", "last_committed_batch", "backup_to")
            want = "page_visits", ckpt, 0, last, location
        case ("bootstrap",):
            new = cp.root.with_name("page_visits_new")
            got = out.splitlines()[:2]
            want = [
                f"DRY RUN: nothing changed: bootstrap of page_visits_new into {new}",
                f"  transplant the state files of {ckpt}, then start page_visits_new on json "
                f"{cp.root.parent.parent / 'landing' / 'page_visits'}",
            ]
        case ("transplant",):
            got = _pick(doc, "old", "new", "batch", "old_query_id", "dry_run") + (
                os.path.exists(argv[2]),
            )
            want = ckpt, argv[2], last, qid, True, False
        case ("migrate",):
            got = (
                _pick(doc, "query", "backup_to")
                + _pick(doc["old"], "checkpoint", "last_committed_batch")
                + (
                    doc["new"]["source"]["path"],
                    doc["new"]["checkpoint"],
                    doc["carry_over"]["road"],
                )
            )
            want = "page_visits", location, ckpt, last, argv[3], f"{ckpt}.v2", "transplant"
        case ("upgrade",):  # the walk's page_visits runs its own code: nothing to rewrite
            verdicts = {c["verdict"] for c in doc["changes"]}
            got = _pick(doc, "query", "checkpoint", "rewrite") + (verdicts,)
            want = "page_visits", ckpt, False, {"unchanged"}
        case ("queries",):
            got = ([q["name"] for q in doc["queries"]],)
            want = (list(yaml.safe_load(Path(doc["registry"]).read_text())["queries"]),)
        case ("status",):
            [status] = doc
            got = _pick(status, "query", "checkpoint", "last_committed_batch") + (
                [b["backup_id"] for b in status["backups"]],
            )
            want = "page_visits", ckpt, last, [backup_id]
        case ("unretire",):  # the walk's checkpoint holds no retirement: nothing lifted
            got = doc["lifted"], "nothing to lift" in err
            want = None, True
        case ("stop",):  # nothing runs: said, and no request left for a later run to take
            marker = cp.root.parent.parent / "_stateops" / "control" / "page_visits" / "stop"
            got = out, marker.exists()
            want = (
                "page_visits: no run holds its lease (see stateops status): nothing to stop\n",
                False,
            )
        case ("lock", "show"):
            got, want = (doc,), ({"query": "page_visits", "state": None, "lock": None},)
        case ("lock", "release"):
            got, want = (out,), ("page_visits: not locked\n",)
        case ("generate",):
            landing = cp.root.parent.parent / "landing"
            got = tuple(out.splitlines())
            want = tuple(f"{d}: 4 files in {landing / d}" for d in ("user_sessions", "page_visits"))
        case _:
            raise AssertionError(f"{command}: a row the walk does not check; say what it must say")
    assert got == want, what


def test_the_cli_table_of_every_command_walks(s3, checkpoint, tmp_path, capsys, monkeypatch):
    """Every row of docs/cli.md "Every CLI command" run as its synopsis says, by a query's name
    (a dry run where the row has one; the three Spark runs without one, export, run and drill,
    have their own tests): exit 0, JSON where the row says so, what it says about this
    checkpoint (:func:`_says`), and a dry run's plan first says DRY RUN and last what cannot be
    undone, the backup and the undo; then by a name no registry knows: exit 2, one line that
    names it. The checkpoint is byte-identical after."""
    registry, ckpt = checkpoint
    raw = yaml.safe_load(registry.read_text())
    fresh = dict(
        raw["queries"]["page_visits"],
        checkpoint="checkpoints/page_visits_new",
        sink={"format": "parquet", "path": "output/page_visits_new"},
    )
    raw["queries"]["page_visits_new"] = fresh  # an empty checkpoint to bootstrap
    raw["backups"] = {"url": "s3://backups/walk"}
    walk_registry = tmp_path / "registry.yaml"
    walk_registry.write_text(yaml.safe_dump(raw, sort_keys=False))
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    (tmp_path / "new-source").mkdir()
    values = {"N": "0", "K": "2", "PATH": str(ckpt), "FOLDER": str(tmp_path / "new-source")}
    before = tree_digest(ckpt)

    def run(argv: list[str]) -> tuple[int, str, str]:
        code = cli.main(["--registry", str(walk_registry), *argv])
        out, err = capsys.readouterr()
        return code, out, err

    walked = []
    walked_ckpt = load_checkpoint(ckpt)
    for row in cli_table():
        argv = _walk_argv(
            row, "page_visits_new" if row.words[0] == "bootstrap" else "page_visits", values
        )
        if row.words[0] == "repartition":
            argv[argv.index("0")] = "3"
        if row.words[0] == "transplant":
            argv[2] = str(tmp_path / "transplanted")
        if row.words[0] == "migrate":  # a new source with its first file landed
            argv[3] = str(_new_source(tmp_path / "landed"))
        if row.spark and not row.dry_run:
            pass  # export, run and drill: their own tests run them
        else:
            code, out, err = run(argv)
            assert code == 0, (argv, err)
            if row.json != "-":  # one document, or JSON lines (audit)
                assert _json_documents(out), (argv, out)
            _says(row.command, argv, out, err, walked_ckpt, values)
            if row.dry_run:  # a plan that reads as one, on stderr where stdout is JSON
                plan = (err if row.json != "-" else out).splitlines()
                assert plan[0].startswith("DRY RUN: nothing changed: "), (argv, plan)
                assert [line.split(":")[0] for line in plan[-3:]] == [
                    "  irreversible",
                    "  backup",
                    "  undo",
                ], (argv, plan)
            walked.append(row.command)
            if row.command == ("cleanup",):  # the backup taken above, by its id (issue 40)
                assert f"stateops restore {values['URL']} --to {ckpt} --replace" in err, err
            if row.command == ("backup",):
                taken = json.loads(out)
                values["URL"] = f"s3://backups/walk/page_visits/{taken['backup_id']}"
        if row.by_name:
            code, out, err = run(_walk_argv(row, "no_such_query", values))
            assert code == 2 and len(err.strip().splitlines()) == 1, (row.words, err)
            assert "no_such_query" in err, (row.words, err)
    assert len(walked) == len(cli_table()) - 3
    assert tree_digest(ckpt) == before


def test_the_cli_backup_of_a_query_applies_the_registry_retention_as_the_dag_does(
    s3, checkpoint, tmp_path, capsys, monkeypatch
):
    """`stateops backup QUERY` backs up to the query's place under `backups.url`, then keeps
    what the registry's retention says, the same step as the scheduled DAG (issue 41)."""
    registry, _ = checkpoint
    raw = yaml.safe_load(registry.read_text())
    raw["backups"] = {"url": "s3://backups/cli-retention", "keep_last": 1, "max_age": None}
    kept_one = tmp_path / "registry.yaml"
    kept_one.write_text(yaml.safe_dump(raw, sort_keys=False))
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)

    def backup() -> tuple[dict, str]:
        assert cli.main(["--registry", str(kept_one), "backup", "page_visits"]) == 0
        out, err = capsys.readouterr()
        return json.loads(out), err

    first, _ = backup()
    second, said = backup()
    location = "s3://backups/cli-retention/page_visits"
    listed = list_backups(location, s3.client())
    assert [b["backup_id"] for b in listed] == [second["backup_id"]], "the older one is pruned"
    assert second["retention"]["kept"] == [second["backup_id"]]
    assert second["retention"]["deleted_backups"] == [first["backup_id"]]
    assert "retention: kept 1 backups, deleted 1 and " in said, said
    # Elsewhere (--to): no retention, the registry's is for the query's own place.
    elsewhere = "s3://backups/cli-retention-elsewhere"
    args = ["--registry", str(kept_one), "backup", "page_visits", "--to", elsewhere]
    for _ in range(2):
        assert cli.main(args) == 0
        assert "retention" not in json.loads(capsys.readouterr().out)
    assert len(list_backups(elsewhere, s3.client())) == 2


def test_a_restore_drill_reads_a_backups_state_and_catches_one_damaged_after_it_was_taken(
    spark, s3, checkpoint, tmp_path
):
    """`stateops drill` (issue 57, item 4): a backup restored into a scratch place beside the
    checkpoint and its state read by Spark (the export job, spark-submit), recorded beside the
    manifest with the rows and checksum of every store, equal to an export of the live
    checkpoint at that batch. A backup whose object is damaged after it was taken fails its
    drill (exit 1, one line naming the object): recorded, a FAIL of the health rule
    backup_drill, and retention keeps the newest backup that passed. The checkpoint is
    byte-identical throughout, and no scratch place is left."""
    from stateops.spark.export import export_state
    from stateops.status import format_status, query_status
    from stateops_airflow.ui import _query_card

    registry, ckpt = checkpoint
    raw = yaml.safe_load(registry.read_text())
    raw["backups"] = {"url": "s3://backups/drill", "keep_last": 1, "max_age": None}
    drill_registry = tmp_path / "registry.yaml"
    drill_registry.write_text(yaml.safe_dump(raw, sort_keys=False))
    client, where = s3.client(), "s3://backups/drill/page_visits"
    last = load_checkpoint(ckpt).last_committed_batch
    older = backup_checkpoint(ckpt, where, client, batch=last - 1, log=lambda _: None)
    newest = backup_checkpoint(ckpt, where, client, log=lambda _: None)
    before = tree_digest(ckpt)

    def drill(backup: str) -> tuple[int, str, str]:
        argv = ["--registry", str(drill_registry), "drill", "page_visits", "--backup", backup]
        done = run_cli(*argv, env=s3.env(), timeout=600)
        assert not list(ckpt.parent.glob("*.drill-*")), ("the scratch place is left", done.stderr)
        assert tree_digest(ckpt) == before
        return done.returncode, done.stdout, done.stderr

    code, out, err = drill(older["backup_id"])
    passed = json.loads(out)
    assert code == 0, err
    assert (passed["backup_id"], passed["batch_id"], passed["ok"]) == (
        older["backup_id"],
        last - 1,
        True,
    )
    live = export_state(spark, str(ckpt), tmp_path / "live", last - 1)["entries"]
    assert live and passed["state"] == {
        f"operator {e['operator_id']} {e['variable']}": {k: e[k] for k in ("rows", "checksum")}
        for e in live
    }

    # The newest backup's commit file, which only it holds, damaged in the bucket afterwards.
    commit = next(f for f in newest["files"] if f["path"] == f"commits/{last}")
    key = f"page_visits/objects/{commit['sha256']}"
    client.put_object(Bucket="backups", Key=f"drill/{key}", Body=b"damaged after the backup")
    code, out, err = drill("latest")
    assert (code, out) == (1, "")
    assert err.strip().splitlines()[-1] == (
        f"error: backup {newest['backup_id']} of page_visits fails its restore drill: the "
        f"restore failed: s3://backups/drill/{key} is corrupt: its content does not match the "
        f"sha256 of commits/{last} in the manifest; restore an older backup"
    )
    drills = {b["backup_id"]: b["drill"] for b in list_backups(where, client)}
    assert drills[older["backup_id"]]["ok"] and not drills[newest["backup_id"]]["ok"]

    status = query_status(load_registry(drill_registry), "page_visits", client)
    health, drill_of = status["health"], {b["backup_id"]: b["drill"] for b in status["backups"]}
    for shown in (format_status(status), _query_card(status)):  # stateops status, the UI view
        assert f"drill passed {drill_of[older['backup_id']]['drilled_at']}" in shown
        assert f"drill FAILED {drill_of[newest['backup_id']]['drilled_at']}: the restore" in shown
    assert health["verdict"] == "FAIL"
    [finding] = [f for f in health["findings"] if f["rule"] == "backup_drill"]
    assert finding["reason"].startswith(
        f"backup {newest['backup_id']} (batch {last}) failed its restore drill at "
    ), finding
    assert f"`stateops backups verify {where}/{newest['backup_id']}`" in finding["reason"]

    # keep_last 1 keeps the newest, and the newest that passed its drill with its record.
    pruned = prune_backups(where, client, keep_last=1, grace="0s")
    assert pruned["kept"] == sorted([older["backup_id"], newest["backup_id"]])
    assert pruned["kept_for_drill"] == older["backup_id"]
    assert [b["drill"]["ok"] for b in list_backups(where, client)] == [True, False]
