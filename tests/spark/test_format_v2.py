"""Checkpoint format v2 (issue 21, items 3 and 4, first step): a registered query may write it
(``state_store.checkpoint_format: 2``), ``inspect`` says which format a checkpoint uses, and
no operation that reads format v1 only meets a v2 checkpoint unawares: each refuses in one line
that names the format, and the checkpoint is byte-identical after. (In v2 several files of one
state version can exist and the commit log's ids choose among them: picking by version number
alone would delete or copy the wrong ones.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stateops.core.checkpoint import load_checkpoint
from stateops.core.registry import load_registry
from tests.conftest import run_cli, tree_digest, write_registry
from tests.spark.harness import land, run_in_session

pytestmark = pytest.mark.spark

QUERY = "page_visits"


@pytest.fixture(scope="module")
def v2(spark, s3, tmp_path_factory):
    """A registry whose page_visits writes format v2, run by Spark over three files."""
    root = tmp_path_factory.mktemp("format-v2")
    registry = write_registry(
        root,
        page_visits={
            "state_store": {"checkpoint_format": 2, "min_deltas_for_snapshot": 2},
            "approval": "none",
        },
    )
    land(root / "landing", round_=0, files=3)
    run_in_session(spark, registry, QUERY)
    (root / "landing_v2").mkdir()  # a new source with input, for the migration's preflight
    next((root / "landing" / QUERY).iterdir()).rename(root / "landing_v2" / "events.json")
    return registry


def test_spark_wrote_format_v2_and_inspect_says_so(v2):
    checkpoint = Path(load_registry(v2).query(QUERY).checkpoint)
    cp = load_checkpoint(checkpoint)
    assert cp.last_committed_batch == 2
    # Spark's own marks of v2: commits that name the state files of their batch, and state
    # files named <version>_<id>.
    assert all(c.get("stateUniqueIds") for c in cp.commits.values()), cp.commits
    state_files = [p.name for p in (checkpoint / "state").rglob("*.changelog")]
    assert state_files and all(re.fullmatch(r"\d+_[0-9a-f-]{36}\.changelog", n)
                               for n in state_files), state_files  # fmt: skip
    assert cp.format_version == 2
    report = json.loads(run_cli("--registry", str(v2), "inspect", QUERY, "--json",
                                check=True).stdout)  # fmt: skip
    assert report["format_version"] == 2
    text = run_cli("--registry", str(v2), "inspect", QUERY, check=True).stdout
    assert "format      v2 (read-only here: operations refuse it)" in text, text
    # The on-call engineer learns it from the health verdict before an operation refuses.
    status = run_cli("--registry", str(v2), "status", QUERY, "--json")
    [health] = [q["health"] for q in json.loads(status.stdout) if q["query"] == QUERY]
    assert health["verdict"] != "OK" and any(
        r.startswith("checkpoint format v2: verify, cleanup, rollback, backup")
        for r in health["reasons"]
    ), health


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["verify", QUERY], 1),
        (["cleanup", QUERY, "--retain-batches", "1", "--dry-run"], 2),
        (["cleanup", QUERY, "--retain-batches", "1"], 2),
        (["rollback", QUERY, "--to-batch", "0", "--dry-run"], 2),
        (["rollback", QUERY, "--to-batch", "0"], 2),
        (["backup", QUERY, "--to", "s3://backups/v2"], 2),
        (["transplant", QUERY, "{root}/transplanted", "--dry-run"], 2),
        (["repartition", QUERY, "--partitions", "3", "--dry-run"], 2),
        (["backfill", QUERY, "--to-batch", "0", "--dry-run"], 2),
        (["migrate", QUERY, "--new-source-path", "{root}/landing_v2", "--dry-run"], 2),
    ],
    ids=lambda v: " ".join(v[:3]) if isinstance(v, list) else None,
)
def test_every_v1_operation_refuses_a_v2_checkpoint_in_one_line_and_changes_nothing(
    v2, s3, args, code
):
    checkpoint = Path(load_registry(v2).query(QUERY).checkpoint)
    before = tree_digest(checkpoint)
    args = [a.format(root=v2.parent) for a in args]
    proc = run_cli("--registry", str(v2), *args, env=s3.env())
    said = [line for line in (proc.stdout + proc.stderr).splitlines()
            if "checkpoint format v2" in line and "reads format v1 only" in line]  # fmt: skip
    assert proc.returncode == code and said, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    if code == 2:
        assert proc.stderr.strip().count("\n") == 0, f"more than one line: {proc.stderr}"
    assert tree_digest(checkpoint) == before, f"stateops {' '.join(args)} changed the checkpoint"
    assert not (v2.parent / "transplanted").exists()
