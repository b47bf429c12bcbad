"""Hostile input against the CLI, on copies of one checkpoint Spark wrote here: every fault is
one line on stderr (no traceback), exit code 2, the checkpoint byte-identical, and nothing left
beside a path that is not a checkpoint.

Tests run as root here, and root ignores permission bits. A read-only or unreadable checkpoint
is therefore made three ways that fail for root too, each skipped where the machine cannot:
- ``permissions``: chmod, with the CLI run without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH
  (``setpriv --bounding-set``): still uid 0, so it reads the 0700 pytest folders it owns,
  but permission bits now bind it as they bind any user (EACCES);
- ``immutable``: ``chattr +i`` (EPERM even for root; needs ext4-like file systems and
  CAP_LINUX_IMMUTABLE);
- ``read-only mount``: the CLI runs in its own mount namespace (``unshare -m``) with the
  checkpoint bind-mounted read-only (EROFS); the mount dies with the process, so nothing
  outlives a failed test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import StateOpsError
from stateops.spark.jobs import job_path, preflight_job
from tests.conftest import VENV_BIN, run_cli, tree_digest, whole_after, write_registry
from tests.spark.harness import aggregation_case, land

pytestmark = pytest.mark.spark

ROOT_USER = os.geteuid() == 0
NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


@pytest.fixture(scope="module")
def written(spark, tmp_path_factory) -> Path:
    """One RocksDB aggregation checkpoint with several batches and snapshot groups, and its
    per-batch sink (``out/batch_id=N``), written by Spark; tests work on copies."""
    root = tmp_path_factory.mktemp("hostile")
    land(root / "landing", round_=0, files=5)
    aggregation_case("rocksdb").run(spark, root, root / "ckpt", root / "out")
    assert load_checkpoint(root / "ckpt").last_committed_batch >= 3
    return root


@pytest.fixture
def ckpt(written, tmp_path) -> Path:
    shutil.copytree(written / "ckpt", tmp_path / "ckpt")
    shutil.copytree(written / "out", tmp_path / "out")
    return tmp_path / "ckpt"


def one_line_refusal(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """The single stderr line of a refused command (exit 2, no traceback)."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1500:], proc.stderr[-1500:])
    assert "Traceback" not in proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


def cli_as(mechanism: str | None, target: Path, *args: str, env: dict | None = None):
    """``stateops ARGS`` as ``mechanism`` makes ``target`` read-only (see the module doc)."""
    if mechanism is None:
        return run_cli(*args, env=env)
    if mechanism == "read-only mount":
        script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
        prefix = ["unshare", "-m", "sh", "-c", script, "sh", str(target)]
    else:
        prefix = NO_DAC if ROOT_USER and mechanism == "permissions" else []
    return subprocess.run(
        [*prefix, str(VENV_BIN / "stateops"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def make_read_only(mechanism: str, target: Path) -> None:
    if mechanism == "permissions":
        if ROOT_USER and shutil.which("setpriv") is None:
            pytest.skip("root without setpriv: permission bits cannot bind the CLI")
        subprocess.run(["chmod", "-R", "a-w", str(target)], check=True)
    elif mechanism == "immutable":
        done = subprocess.run(["chattr", "-R", "+i", str(target)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"chattr +i does not work here: {done.stderr.decode().strip()}")
    else:
        probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
        if probe.returncode != 0:
            pytest.skip("no mount namespaces here (unshare -m)")


def make_writable(target: Path) -> None:
    subprocess.run(["chattr", "-R", "-i", str(target)], capture_output=True)
    subprocess.run(["chmod", "-R", "u+w", str(target)], check=True)


READ_ONLY = ["permissions", "immutable", "read-only mount"]


@pytest.mark.parametrize("mechanism", whole_after(1, READ_ONLY))
@pytest.mark.parametrize("command", ["cleanup", "rollback"])
def test_a_read_only_checkpoint_is_refused_before_anything_is_written(ckpt, mechanism, command):
    last = load_checkpoint(ckpt).last_committed_batch
    args = {
        "cleanup": ["cleanup", str(ckpt), "--retain-batches", "1"],
        "rollback": ["rollback", str(ckpt), "--to-batch", str(last - 2), "--no-backup"],
    }[command]
    before, around = tree_digest(ckpt), siblings(ckpt)
    make_read_only(mechanism, ckpt)
    try:
        proc = cli_as(mechanism, ckpt, *args)
    finally:
        make_writable(ckpt)
    line = one_line_refusal(proc, f"{command} of {ckpt}", "refused before changing anything")
    assert "plan" not in proc.stdout, "the plan is not printed for a run that cannot happen"
    assert tree_digest(ckpt) == before
    assert siblings(ckpt) == around, "no .audit folder, lock, guard or rollback marker"
    # Writable again, the same command runs: nothing (no pending marker) blocks it.
    again = run_cli(*args)
    assert again.returncode == 0, (line, again.stderr)


@pytest.mark.parametrize("mechanism", ["permissions", "immutable"])
def test_a_read_only_audit_folder_or_sink_refuses_the_rollback_before_the_checkpoint_changes(
    ckpt, mechanism
):
    last = load_checkpoint(ckpt).last_committed_batch
    sink, audit = ckpt.parent / "out", ckpt.parent / "ckpt.audit"
    audit.mkdir()
    (audit / "audit.jsonl").write_text("")
    before = tree_digest(ckpt), tree_digest(sink), tree_digest(audit)
    for read_only in (audit, sink):
        make_read_only(mechanism, read_only)
        try:
            proc = cli_as(
                mechanism,
                read_only,
                "rollback",
                str(ckpt),
                "--to-batch",
                str(last - 1),
                "--no-backup",
                "--sink",
                str(sink),
            )
        finally:
            make_writable(read_only)
        one_line_refusal(proc, "refused before changing anything", str(read_only))
        assert (tree_digest(ckpt), tree_digest(sink), tree_digest(audit)) == before


def _hostile_paths(tmp: Path) -> dict[str, tuple[Path, str]]:
    """name -> (path, what the error line says about it)."""
    (tmp / "loop").symlink_to(tmp / "loop")
    (tmp / "a-file").write_text("not a checkpoint\n")
    (tmp / "empty").mkdir()
    return {
        "symlink to itself": (tmp / "loop", "symbolic link loop"),
        "name too long": (tmp / ("x" * 300), "longer than the file system allows"),
        "regular file": (tmp / "a-file", "a file, not a checkpoint directory"),
        "below a regular file": (tmp / "a-file" / "ckpt", "not a folder"),
        "mistyped": (tmp / "ckpt-typo", "no such directory"),
        "empty folder": (tmp / "empty", "not a Spark checkpoint"),
    }


COMMANDS = {
    "inspect": ["inspect", "{path}"],
    "verify": ["verify", "{path}"],
    "cleanup": ["cleanup", "{path}", "--retain-batches", "1"],
    "rollback": ["rollback", "{path}", "--to-batch", "1", "--no-backup"],
    "export": ["export", "{path}", "--out", "{tmp}/export"],
    "backup": ["backup", "{path}", "--to", "s3://backups/hostile"],
    "audit": ["audit", "{path}"],
}


@pytest.mark.parametrize("command", whole_after(3, COMMANDS))
def test_a_path_that_is_not_a_checkpoint_is_one_line_and_leaves_nothing_beside_it(
    tmp_path, command, no_jvm
):
    for name, (path, says) in _hostile_paths(tmp_path).items():
        before = siblings(tmp_path / "loop")
        args = [a.format(path=path, tmp=tmp_path) for a in COMMANDS[command]]
        proc = run_cli(*args)
        assert no_jvm() == [], f"{name}: a refusal must not start a JVM"
        one_line_refusal(proc, says, str(path)[:60])
        assert siblings(tmp_path / "loop") == before, f"{command} on {name} left litter"


# What each command does with a checkpoint part it may not read, decided: refused in one line
# that names the path (2), before anything changes; verify reports what it cannot read inside a
# checkpoint as a finding (1), as it reports a missing file (the folder itself: a refusal). A
# RocksDB snapshot (the state file here) is opened by cleanup, to know the SST files it still
# needs, and by export; rollback would delete it, and a file without write permission is a
# read-only checkpoint to it: all three refuse. Inspect, from names and sizes, runs (0).
UNREADABLE = {
    "unreadable folder": {"inspect": 2, "verify": 2, "cleanup": 2, "rollback": 2, "export": 2},
    "unreadable metadata": {"inspect": 2, "verify": 1, "cleanup": 2, "rollback": 2, "export": 2},
    "unreadable offsets/": {"inspect": 2, "verify": 2, "cleanup": 2, "rollback": 2, "export": 2},
    "unreadable state file": {"inspect": 0, "verify": 1, "cleanup": 2, "rollback": 2, "export": 2},
}


@pytest.mark.parametrize("damage", UNREADABLE)
@pytest.mark.parametrize("command", ["inspect", "verify", "cleanup", "rollback", "export"])
def test_an_unreadable_checkpoint_is_one_line_naming_the_path(ckpt, damage, command):
    if ROOT_USER and shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: permission bits cannot bind the CLI")
    cp = load_checkpoint(ckpt)
    needed = cp.restart_files(cp.last_committed_batch)  # what a restart, or an export, reads
    state_file = ckpt / next(
        rel for rel in needed if rel.startswith("state/") and not Path(rel).name.startswith(".")
    )  # not a .crc sidecar
    victim = {
        "unreadable folder": ckpt,
        "unreadable metadata": ckpt / "metadata",
        "unreadable offsets/": ckpt / "offsets",
        "unreadable state file": state_file,
    }[damage]
    args = [a.format(path=ckpt, tmp=ckpt.parent) for a in COMMANDS[command]]
    before, around = tree_digest(ckpt), siblings(ckpt)
    mode = victim.stat().st_mode
    victim.chmod(0)
    try:
        proc = cli_as("permissions", ckpt, *args)
    finally:
        victim.chmod(mode)
    expected = UNREADABLE[damage][command]
    assert proc.returncode == expected, (proc.returncode, proc.stdout[-1500:], proc.stderr[-1500:])
    assert "Traceback" not in proc.stderr
    if expected == 1:  # verify's contract: a finding, exit 1
        assert "ERROR    " in proc.stdout and str(victim) in proc.stdout, proc.stdout
        assert "ermission denied" in proc.stdout, proc.stdout
    elif expected == 2:
        line = one_line_refusal(proc)
        assert str(victim) in line or str(ckpt) in line, line
        assert "ermission denied" in line or "unreadable" in line or "not readable" in line, line
    assert tree_digest(ckpt) == before
    assert siblings(ckpt) == around


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("not empty", "not empty; export into a new or empty folder"),
        ("a file", "a file, not a folder; export into a new or empty folder"),
        ("below a file", "not a folder"),
        ("read-only parent", "refused before changing anything"),
        ("uncommitted batch", "batch 99"),
        ("name too long", "longer than the file system allows"),
    ],
)
def test_export_refusals_come_before_spark_submit(ckpt, case, says, no_jvm):
    out = ckpt.parent / "export"
    batch: list[str] = []
    if case == "not empty":
        out.mkdir()
        (out / "keep.txt").write_text("mine\n")
    elif case == "a file":
        out.write_text("mine\n")
    elif case == "below a file":
        (ckpt.parent / "f").write_text("mine\n")
        out = ckpt.parent / "f" / "export"
    elif case == "read-only parent":
        (ckpt.parent / "ro").mkdir()
        out = ckpt.parent / "ro" / "export"
    elif case == "uncommitted batch":
        batch = ["--batch", "99"]
    else:
        out = ckpt.parent / ("e" * 300)
    before, around = tree_digest(ckpt), siblings(ckpt)
    if case == "read-only parent":
        make_read_only("permissions", out.parent)
    try:
        proc = cli_as(
            "permissions" if case == "read-only parent" else None,
            ckpt,
            "export",
            str(ckpt),
            "--out",
            str(out),
            *batch,
        )
    finally:
        make_writable(ckpt.parent)
    assert no_jvm() == [], "refused after spark-submit started a JVM"
    one_line_refusal(proc, says)
    assert tree_digest(ckpt) == before and siblings(ckpt) == around
    if case == "not empty":
        assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    elif case == "a file":
        assert out.read_text() == "mine\n"


def test_export_job_called_directly_refuses_before_its_session(ckpt):
    """The job's own main() runs the same checks first (spark-submit by hand)."""
    out = ckpt.parent / "export"
    out.mkdir()
    (out / "keep.txt").write_text("mine\n")
    proc = subprocess.run(
        [
            str(VENV_BIN / "python"),
            str(job_path("export_state.py")),
            "--checkpoint",
            str(ckpt),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    one_line_refusal(proc, "not empty")


def _bootstrap_registry(tmp: Path, ckpt: Path) -> tuple[Path, Path]:
    """A registry whose page_visits checkpoint is ``ckpt``'s folder; an export-like folder."""
    registry = write_registry(tmp / "data", page_visits={"checkpoint": str(tmp / "new-ckpt")})
    export = tmp / "export"
    export.mkdir()
    return registry, export


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("no such initial state", "no such initial state"),
        ("manifest not JSON", "not a state export manifest"),
        ("variable not exported", "the export has no state variable"),
        ("variable folder missing", "the folder of state variable"),
        ("used checkpoint", "has committed batch"),
        ("checkpoint without a batch", "no committed batch yet"),
    ],
)
def test_bootstrap_refusals_come_before_spark_submit(ckpt, tmp_path, case, says, no_jvm):
    registry, export = _bootstrap_registry(tmp_path, ckpt)
    initial = export
    manifest = {"entries": [{"variable": "pages", "path": "op0/pages"}]}
    if case == "no such initial state":
        initial = tmp_path / "missing"
    elif case == "manifest not JSON":
        (export / "manifest.json").write_text("{not json")
    elif case == "variable not exported":
        manifest["entries"][0]["variable"] = "visits"
        (export / "manifest.json").write_text(json.dumps(manifest))
    elif case == "variable folder missing":
        (export / "manifest.json").write_text(json.dumps(manifest))
    elif case == "used checkpoint":
        (export / "manifest.json").write_text(json.dumps(manifest))
        (export / "op0" / "pages").mkdir(parents=True)
        shutil.copytree(ckpt, tmp_path / "new-ckpt")
    else:  # a checkpoint as the initial state, planned but never committed
        initial = tmp_path / "young"
        shutil.copytree(ckpt, initial)
        for commit in (initial / "commits").iterdir():
            commit.unlink()
    before = tree_digest(ckpt)
    proc = run_cli(
        "--registry", str(registry), "bootstrap", "page_visits", "--initial-state", str(initial)
    )
    assert no_jvm() == [], "refused after spark-submit started a JVM"
    one_line_refusal(proc, says)
    assert tree_digest(ckpt) == before


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("unknown query", "no_such_query"),
        ("uncommitted batch", "batch 99"),
        ("damaged checkpoint", "fails file-level verification"),
    ],
)
def test_validate_refusals_come_before_spark_submit(ckpt, tmp_path, case, says, no_jvm):
    """``verify --data`` runs validate_state.py's preflight before spark-submit."""
    registry = write_registry(tmp_path / "data", page_visits={"checkpoint": str(ckpt)})
    if case == "damaged checkpoint":
        last = load_checkpoint(ckpt).last_committed_batch
        (ckpt / "offsets" / str(last - 1)).unlink()
    argv = [
        "--registry",
        str(registry),
        "--query",
        "no_such_query" if case == "unknown query" else "page_visits",
    ]
    if case == "uncommitted batch":
        argv += ["--batch", "99"]
    before = tree_digest(ckpt)
    with pytest.raises(StateOpsError, match=says):
        preflight_job(job_path("validate_state.py"), argv)
    assert tree_digest(ckpt) == before
    if case == "unknown query":  # and through the CLI, in one line, before a JVM
        proc = run_cli("--registry", str(registry), "verify", "no_such_query", "--data")
        assert no_jvm() == [], "refused after spark-submit started a JVM"
        one_line_refusal(proc, says)


@pytest.mark.parametrize(
    "endpoint",
    whole_after(1, ["not a url", "localhost:9000", "http://", "http://[::1", "ftp://host"]),
)
def test_an_endpoint_that_is_not_a_url_is_one_line(ckpt, endpoint):
    before = tree_digest(ckpt)
    env = {"STATEOPS_S3_ENDPOINT_URL": endpoint}
    url = "s3://backups/x"
    around = siblings(ckpt)
    for args in (
        ["backup", str(ckpt), "--to", url],
        ["backups", "list", url],
        ["rollback", str(ckpt), "--to-batch", "1", "--backup-to", url],
    ):
        proc = run_cli(*args, env=env)
        one_line_refusal(proc, "is not a URL", "STATEOPS_S3_ENDPOINT_URL")
    assert tree_digest(ckpt) == before
    assert siblings(ckpt) == around, "no lock, guard or rollback marker"


@pytest.mark.parametrize(
    "entry",
    whole_after(
        1,
        [{"path": 7}, {"path": None}, {"path": ["a"]}, {"sha256": 1}, {"size": "12"}, "metadata"],
        ids=["int path", "null path", "list path", "int sha256", "text size", "not an object"],
    ),
)
def test_a_manifest_entry_of_the_wrong_type_is_one_line(s3, ckpt, tmp_path, entry):
    url = f"s3://backups/{tmp_path.name}"
    backed = run_cli("backup", str(ckpt), "--to", url, env=s3.env())
    assert backed.returncode == 0, backed.stderr
    client = s3.client()
    bucket, prefix = url[5:].split("/", 1)
    [obj] = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/manifests/")["Contents"]
    manifest = json.loads(client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
    good = manifest["files"][0]
    manifest["files"][0] = {**good, **entry} if isinstance(entry, dict) else entry
    client.put_object(Bucket=bucket, Key=obj["Key"], Body=json.dumps(manifest))
    backup_url = f"{url}/{manifest['backup_id']}"
    target = tmp_path / "restored"
    for args in (
        ["backups", "list", url],
        ["backups", "verify", backup_url],
        ["restore", backup_url, "--to", str(target)],
    ):
        proc = run_cli(*args, env=s3.env())
        one_line_refusal(proc, "files[0] is not a file entry", "the manifest is damaged")
    assert not any(p.name.startswith("restored") for p in tmp_path.iterdir())
