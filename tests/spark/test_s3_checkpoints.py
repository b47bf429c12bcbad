"""Checkpoints in S3 (issue 22): every library-side operation on a copy of a Spark-written
checkpoint uploaded to the embedded S3 endpoint does what it does on the local copy.

Per case (both providers, both reference processors, an aggregation and a join): the local
copy and the S3 copy go through the same chain of operations (cleanup; a rollback; a backup,
restored into a new place; for the two pipelines a transplant of that into another); the S3
result, brought back to local disk, holds the same files byte for byte (but the query id a
transplant draws and the location operator metadata names) and continues with Spark to the
same state and output as the local result. Damage on S3 is found and named as
it is locally; an endpoint that stops or throttles mid-cleanup, or wrong credentials, give one
line, and a second run completes with nothing lost.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from stateops.control.audit import read_audit
from stateops.control.lock import new_run_id
from stateops.control.target import Target
from stateops.core.checkpoint import has_commit, load_checkpoint
from stateops.core.errors import CheckpointError, StateOpsError
from stateops.core.files import relocate_checkpoint, relocated_metadata
from stateops.core.formats import crc_sidecar
from stateops.core.registry import load_registry
from stateops.core.report import checkpoint_report
from stateops.core.s3 import S3Settings, s3_client
from stateops.core.storage import location
from stateops.core.verify import verify_checkpoint
from stateops.ops.backup import backup_checkpoint
from stateops.ops.cleanup import run_cleanup
from stateops.ops.restore import restore_backup
from stateops.ops.rollback import run_rollback
from stateops.ops.transplant import transplant_checkpoint
from tests.conftest import S3_KEY, S3_SECRET, write_registry
from tests.s3proxy import S3Proxy
from tests.spark.harness import (
    ALL_CASES,
    Case,
    copy_checkpoint,
    gate_cases,
    land,
    read_sink,
    read_state,
    registered_query,
    round_0,
)

pytestmark = pytest.mark.spark

# Both providers, both reference processors, an aggregation and a join.
SHOWN = ("user_sessions-rocksdb", "page_visits-rocksdb", "aggregation-hdfs", "join-rocksdb")
CASES = [c for c in ALL_CASES if c.name in SHOWN]
TRANSPLANTED = ("user_sessions-rocksdb", "page_visits-rocksdb")  # registered: a transplant's query
BUCKET = "checkpoints"
RETAIN = 2
quiet = lambda _: None  # noqa: E731


@pytest.fixture(scope="module")
def s3_env(s3):
    """The S3 server as the environment names it (where checkpoint URLs are read), with a
    bucket for checkpoints."""
    s3.client().create_bucket(Bucket=BUCKET)
    with pytest.MonkeyPatch.context() as mp:
        for name, value in s3.env().items():
            mp.setenv(name, value)
        yield s3


def contents(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def comparable(root: Path, transplanted: bool) -> dict[str, bytes]:
    """Every file's bytes, but what differs by place and run: the schema paths operator
    metadata v2 names (made relative, their checksums left out) and the query id a
    transplant draws."""
    files = contents(root)
    for op in load_checkpoint(root).operators:
        for key, rel in op.metadata_files.items():
            if key is not None:
                text = files[rel].decode("utf-8")
                files[rel] = relocated_metadata(text, op.operator_id, Path("/CK"))
                files.pop(crc_sidecar(rel), None)
    if transplanted:
        assert json.loads(files.pop("metadata"))["id"], root
        files.pop(crc_sidecar("metadata"))
    return files


def at(checkpoint: str | Path, root: Path) -> Target:
    """``checkpoint`` unregistered: its lock beside its audit log, or for an S3 URL in the
    state folder of a registry under ``root``."""
    return Target(str(checkpoint), load_registry(write_registry(root / "registry")), None)


def chain(s3, case: Case, checkpoint: str | Path, root: Path, name: str, place) -> tuple:
    """The operations both copies go through: cleanup; a rollback of one batch; a backup,
    restored into a new place (``place(what)``: a folder or an S3 URL); for a pipeline, a
    transplant of that into another. The plans and where the result is."""
    cleaned = run_cleanup(at(checkpoint, root), RETAIN, run_id=new_run_id("cleanup"), log=quiet)
    to_batch = cleaned["last_committed_batch"] - 1
    rolled = run_rollback(at(checkpoint, root), to_batch, run_id=new_run_id("rollback"), log=quiet)
    backups = f"s3://backups/{case.name}-{name}"
    manifest = backup_checkpoint(checkpoint, backups, s3.client(), log=quiet)
    restored = place("restored")
    restore_backup(f"{backups}/{manifest['backup_id']}", restored, s3.client(), log=quiet)
    if case.name not in TRANSPLANTED:
        return (cleaned, rolled), restored
    new = place("transplanted")
    query = registered_query(root, case.landing, Path("unused"), root / "unused")
    transplant_checkpoint(
        restored, new, query.model_copy(update={"checkpoint": str(new)}), log=quiet
    )
    return (cleaned, rolled), new


@dataclass
class Story:
    case: Case
    root: Path
    url: str
    inspected: tuple[dict, dict]  # (local, S3)
    verified: tuple[dict, dict]
    plans: tuple[tuple[dict, dict], tuple[dict, dict]]
    result: str  # where the S3 chain ended
    files: tuple[dict[str, bytes], dict[str, bytes]]
    continued: tuple[tuple, tuple]
    round0_state: list


def built(spark, tmp_path_factory, case: Case) -> Path:
    """A folder with the case's checkpoint after round 0 (6 files), as test_checkpoint_model
    starts from it (:func:`round_0`)."""
    root = tmp_path_factory.mktemp(f"s3-{case.name}")
    round_0(spark, tmp_path_factory, case, 6, root)
    return root


def without_location(report: dict) -> dict:
    return {k: v for k, v in report.items() if k != "checkpoint"}


@pytest.fixture(scope="module", params=gate_cases(CASES, {"page_visits-rocksdb"}))
def story(request, spark, tmp_path_factory, s3_env) -> Story:
    case: Case = request.param
    root = built(spark, tmp_path_factory, case)
    local = copy_checkpoint(root / "ck-original", root / "ck-local")
    url = s3_env.upload(local, BUCKET, case.name)

    inspected = tuple(checkpoint_report(load_checkpoint(c), 2) for c in (local, url))
    verified = tuple(verify_checkpoint(c) for c in (local, url))
    (plans, local_result), (plans_s3, s3_result) = (
        chain(s3_env, case, local, root, "local", lambda what: root / f"ck-local-{what}"),
        chain(s3_env, case, url, root, "s3", lambda what: f"{url}-{what}"),
    )
    from_s3 = s3_env.download(BUCKET, s3_result[len(f"s3://{BUCKET}/") :], root / "ck-from-s3")
    transplanted = case.name in TRANSPLANTED
    files = (comparable(local_result, transplanted), comparable(from_s3, transplanted))

    relocate_checkpoint(from_s3)  # the metadata named S3's schema files
    land(root / "landing", round_=1, files=3)
    continued = []
    for ck, out in ((local_result, "out-local"), (from_s3, "out-from-s3")):
        shutil.copytree(root / "out-original", root / out)
        case.run(spark, root, ck, root / out)
        continued.append((read_state(spark, ck, case.state_reads), read_sink(root / out)))
    return Story(
        case=case,
        root=root,
        url=url,
        inspected=inspected,
        verified=verified,
        plans=(plans, plans_s3),
        result=s3_result,
        files=files,
        continued=tuple(continued),
        round0_state=read_state(spark, root / "ck-original", case.state_reads),
    )


def test_inspect_and_verify_answer_on_s3_as_on_the_local_copy(story: Story):
    local, remote = story.inspected
    assert remote["checkpoint"] == story.url
    assert has_commit(story.url) and not has_commit(f"{story.url}-nothing-here")
    assert without_location(remote) == without_location(local)
    assert local["operators"], local  # a stateful query: the comparison covers its state
    local, remote = story.verified
    assert remote["ok"] and local["ok"], remote["findings"]
    assert remote["findings"] == local["findings"]


def test_every_operation_on_s3_leaves_the_files_it_leaves_locally(story: Story):
    (cleaned, rolled), (cleaned_s3, rolled_s3) = story.plans
    assert cleaned["delete"]["files"] > 0 and rolled["delete"]["files"] > 0
    assert cleaned_s3["files"] == cleaned["files"]
    assert rolled_s3["files"] == rolled["files"]
    local, from_s3 = story.files
    assert sorted(from_s3) == sorted(local)
    assert from_s3 == local  # byte for byte
    records = read_audit(story.url)
    assert [r["operation"] for r in records] == ["cleanup", "rollback", "backup"], records
    assert all(r["result"] == "succeeded" for r in records), records
    restored = read_audit(f"{story.url}-restored")
    assert [r["operation"] for r in restored] == ["restore"], restored
    assert verify_checkpoint(story.result)["ok"]


def test_the_s3_result_brought_back_continues_like_the_local_one(story: Story):
    (state, out), (state_s3, out_s3) = story.continued
    assert state_s3 == state
    assert out_s3 == out
    assert state != story.round0_state  # round 1 did change the state


def _damaged(s3, story: Story, tmp_path: Path, name: str, damage) -> tuple[dict, dict]:
    """Verify findings of the same damage done to a local copy and to an S3 copy."""
    local = copy_checkpoint(story.root / "ck-original", tmp_path / name)
    prefix = f"{story.case.name}-{name}"
    url = s3.upload(local, BUCKET, prefix)
    client = s3.client()

    def delete(rel: str) -> None:
        client.delete_object(Bucket=BUCKET, Key=f"{prefix}/{rel}")

    def put(rel: str, data: bytes) -> None:
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{rel}", Body=data)

    damage(local, delete, put)
    return findings(verify_checkpoint(local), local), findings(verify_checkpoint(url), url)


def findings(result: dict, where: Path | str) -> list[dict]:
    """A verify result's findings, the checkpoint's location in their text as ``CK``."""
    return [{**f, "problem": f["problem"].replace(str(where), "CK")} for f in result["findings"]]


def test_damage_on_s3_is_found_and_named(story: Story, s3_env, tmp_path):
    cp = load_checkpoint(story.root / "ck-original")
    restart = [
        rel
        for rel in cp.restart_files(cp.last_committed_batch)
        if not rel.rpartition("/")[2].startswith(".")
    ]
    # A flipped byte in a state file no model reads: only its checksum finds it.
    unread = (".sst", ".delta", ".changelog", ".snapshot")
    flipped = next(rel for rel in restart if rel.endswith(unread) and crc_sidecar(rel) in cp.sizes)
    needed = f"offsets/{cp.last_committed_batch - 1}"  # a restart reads it; nothing else has it

    def missing_and_flipped(local: Path, delete, put) -> None:
        (local / needed).unlink()
        delete(needed)
        data = bytearray((local / flipped).read_bytes())
        data[len(data) // 2] ^= 0x01
        (local / flipped).write_bytes(bytes(data))
        put(flipped, bytes(data))

    def missing_metadata(local: Path, delete, put) -> None:
        (local / "metadata").unlink()
        delete("metadata")

    for name, damage, named in (
        ("damaged", missing_and_flipped, [needed, flipped]),
        ("no-metadata", missing_metadata, [""]),
    ):
        local, remote = _damaged(s3_env, story, tmp_path, name, damage)
        assert remote == local
        errors = {f["path"] for f in remote if f["severity"] == "error"}
        assert set(named) <= errors, remote
    assert remote[0]["problem"].startswith("CK/metadata: missing"), remote


# -- an endpoint that stops or throttles mid-cleanup ----------------------------------------


def throttling(upstream_port: int) -> S3Proxy:
    """A proxy that answers every DeleteObjects request with ``503 SlowDown``, as S3 does to
    a client over its request rate; ``throttled`` counts them."""

    def meddle(command: str, path: str, forward):
        if command == "POST" and "delete" in path:
            proxy.throttled += 1
            return (
                503,
                [],
                (
                    b"<Error><Code>SlowDown</Code><Message>Please reduce your "
                    b"request rate.</Message></Error>"
                ),
            )
        return forward()

    proxy = S3Proxy(upstream_port, meddle)
    proxy.throttled = 0
    return proxy


@pytest.fixture
def uploaded(spark, tmp_path_factory, s3_env, tmp_path) -> tuple[Path, str]:
    """A local copy of the first case's checkpoint and the same bytes in S3."""
    root = built(spark, tmp_path_factory, CASES[0])
    local = copy_checkpoint(root / "ck-original", tmp_path / "local")
    return local, s3_env.upload(local, BUCKET, tmp_path.name)


def _cleaned_locally(local: Path) -> dict[str, bytes]:
    run_cleanup(at(local, local.parent), RETAIN, run_id=new_run_id("cleanup"), log=quiet)
    return contents(local)


def test_an_endpoint_stopped_mid_cleanup_gives_one_line_and_a_second_run_completes(
    uploaded, s3_env, tmp_path
):
    local, url = uploaded

    def stop_when_planned(line: str) -> None:
        if line.startswith("PLAN: cleanup of"):  # the plan is printed, the deletions are next
            s3_env.stop()

    try:
        with pytest.raises(StateOpsError) as err:
            run_id = new_run_id("cleanup")
            run_cleanup(at(url, tmp_path), RETAIN, run_id=run_id, log=stop_when_planned)
    finally:
        s3_env.start()
    line = str(err.value)
    assert "\n" not in line and "the endpoint does not answer" in line and "run again" in line
    assert S3_SECRET not in line
    run_cleanup(at(url, tmp_path), RETAIN, run_id=new_run_id("cleanup"), log=quiet)
    from_s3 = s3_env.download(BUCKET, tmp_path.name, tmp_path / "from-s3")
    assert contents(from_s3) == _cleaned_locally(local)


@pytest.mark.whole
def test_a_backup_to_another_endpoint_streams_the_objects_through(uploaded, s3_env, tmp_path):
    local, url = uploaded
    proxy = S3Proxy(s3_env.port, lambda command, path, forward: forward())  # another endpoint
    try:
        other = s3_client(S3Settings(proxy.endpoint, "us-east-1", S3_KEY, S3_SECRET))
        manifest = backup_checkpoint(url, f"s3://backups/{tmp_path.name}", other, log=quiet)
    finally:
        proxy.shutdown()
    puts = [headers for command, _, headers in proxy.requests if command == "PUT"]
    assert puts and not any("x-amz-copy-source" in {h.lower() for h in p} for p in puts)
    local_backup = backup_checkpoint(
        local, f"s3://backups/{tmp_path.name}-local", s3_env.client(), log=quiet
    )
    restored = {}
    for name, url in (
        ("streamed", f"{tmp_path.name}/{manifest['backup_id']}"),
        ("local", f"{tmp_path.name}-local/{local_backup['backup_id']}"),
    ):
        restored[name] = tmp_path / f"restored-{name}"
        restore_backup(f"s3://backups/{url}", restored[name], s3_env.client(), log=quiet)
    assert comparable(restored["streamed"], False) == comparable(restored["local"], False)


def test_wrong_credentials_give_one_line_and_a_second_run_completes(
    uploaded, s3_env, tmp_path, monkeypatch
):
    local, url = uploaded
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(StateOpsError) as err:
        run_cleanup(at(url, tmp_path), RETAIN, run_id=new_run_id("cleanup"), log=quiet)
    line = str(err.value)
    assert "\n" not in line and "SignatureDoesNotMatch: check the secret key" in line, line
    assert "not-the-secret" not in line
    assert contents(s3_env.download(BUCKET, tmp_path.name, tmp_path / "untouched")) == contents(
        local
    )
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET)
    run_cleanup(at(url, tmp_path), RETAIN, run_id=new_run_id("cleanup"), log=quiet)
    from_s3 = s3_env.download(BUCKET, tmp_path.name, tmp_path / "from-s3")
    assert contents(from_s3) == _cleaned_locally(local)


@pytest.mark.whole
def test_a_throttling_endpoint_gives_one_line_and_a_second_run_completes(
    uploaded, s3_env, tmp_path, monkeypatch
):
    local, url = uploaded
    proxy = throttling(s3_env.port)
    try:
        monkeypatch.setenv("STATEOPS_S3_ENDPOINT_URL", proxy.endpoint)
        with pytest.raises(StateOpsError) as err:
            run_cleanup(at(url, tmp_path), RETAIN, run_id=new_run_id("cleanup"), log=quiet)
    finally:
        proxy.shutdown()
    line = str(err.value)
    assert "\n" not in line and "SlowDown" in line and "throttling" in line, line
    assert proxy.throttled == 6  # the first try and 5 retries, backing off
    assert contents(s3_env.download(BUCKET, tmp_path.name, tmp_path / "untouched")) == contents(
        local
    )
    monkeypatch.setenv("STATEOPS_S3_ENDPOINT_URL", s3_env.endpoint)
    run_cleanup(at(url, tmp_path), RETAIN, run_id=new_run_id("cleanup"), log=quiet)
    from_s3 = s3_env.download(BUCKET, tmp_path.name, tmp_path / "from-s3")
    assert contents(from_s3) == _cleaned_locally(local)


def test_a_log_file_deleted_between_the_listing_and_its_read_is_listed_again(uploaded, monkeypatch):
    """Another host's cleanup deletes a log file after this reader listed it and before it
    read it (an S3 listing and its reads are no snapshot): the reader lists again and sees the
    checkpoint as it now is; one whose listings never settle is refused in one line."""
    import stateops.core.checkpoint as model

    _, url = uploaded
    first = load_checkpoint(url)
    doomed = f"offsets/{min(first.offsets)}"
    listings, walk = [], model.walk

    def walk_then_delete(root):
        listed = walk(root)
        if not listings:  # the cleanup elsewhere, just after the first listing
            (location(url) / doomed).unlink()
        listings.append(listed)
        return listed

    monkeypatch.setattr(model, "walk", walk_then_delete)
    again = load_checkpoint(url)
    assert len(listings) == 2 and min(first.offsets) not in again.offsets
    assert again.last_committed_batch == first.last_committed_batch

    stale = listings[0]  # a listing that keeps naming the deleted file
    monkeypatch.setattr(model, "walk", lambda root: stale)
    with pytest.raises(CheckpointError, match=r"its files were deleted while they were read"):
        load_checkpoint(url)
