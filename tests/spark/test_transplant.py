"""State transplant refusals: each names its reason and leaves the old checkpoint
byte-identical (a transplant that applies: tests/spark/test_carry_over.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from stateops.control.markers import carry_over_marker
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import STATE_OF_OTHER_CODE, StateOpsError
from stateops.core.registry import load_registry
from stateops.ops.transplant import TransplantRefused, transplant_checkpoint
from stateops.pipelines.page_visits import PageVisitsProcessor
from stateops.status import query_status
from tests.conftest import run_cli, tree_digest, write_registry
from tests.spark.harness import USER_CODE, V2_STATE_STORE, job_in_session, land, run_in_session

pytestmark = pytest.mark.spark


class PagesWithReferrer(PageVisitsProcessor):
    """page_visits with one more field in its list state: a changed state schema."""

    def init(self, handle) -> None:
        self.pages = handle.getListState(
            "pages", "page STRING, visited_at TIMESTAMP, referrer STRING"
        )
        self.count = handle.getValueState("count", "visits LONG")


HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
REFUSED = [
    (
        {"processor": {"class": f"{__name__}:PagesWithReferrer", "output_mode": "Update"}},
        None,
        r"state 'pages' holds \(page string, visited_at timestamp\) in the old checkpoint, the "
        r"processor declares \(page string, visited_at timestamp, referrer string\)",
    ),
    (
        {"spark_conf": {"spark.sql.streaming.stateStore.providerClass": HDFS}},
        None,
        r"streaming.stateStore.providerClass is .*RocksDBStateStoreProvider in the old checkpoint, "
        r".*HDFSBackedStateStoreProvider for the new query",
    ),
    (
        {"spark_conf": {"spark.sql.streaming.stateStore.encodingFormat": "avro"}},
        None,
        r"streaming.stateStore.encodingFormat is unsaferow in the old checkpoint, avro",
    ),
    (
        {},
        "kafka",
        r"say where the new checkpoint starts topic visits: a cutover time, its end \(latest\) "
        r"or its beginning \(earliest\)",
    ),
    (
        {"state_store": V2_STATE_STORE},
        None,
        r"the old checkpoint is in format v1, the query writes format v2 "
        r"\(state_store.checkpoint_format\)",
    ),
]


@pytest.fixture(scope="module")
def page_visits(spark, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("transplant")
    path = write_registry(root)
    land(root / "landing", round_=0, files=2)
    run_in_session(spark, path, "page_visits")
    return root


@pytest.mark.parametrize("changes, source_format, reason", REFUSED)
def test_a_transplant_that_does_not_apply_is_refused_with_its_reason(
    page_visits, tmp_path, changes, source_format, reason
):
    old = Path(load_registry(page_visits / "registry.yaml").query("page_visits").checkpoint)
    before = tree_digest(old)
    query = load_registry(write_registry(tmp_path, page_visits=changes)).query("page_visits")
    if source_format:
        moved = {"format": source_format}
        if source_format == "kafka":  # a topic, and no start for it
            moved |= {"path": "", "topic": "visits"}
        source = query.source.model_copy(update=moved)
        query = query.model_copy(update={"source": source})
    with pytest.raises(TransplantRefused, match=reason):
        transplant_checkpoint(old, tmp_path / "new", query)
    assert not (tmp_path / "new").exists() and tree_digest(old) == before


def test_an_unreadable_state_schema_file_refuses_the_transplant(page_visits, tmp_path):
    query = load_registry(page_visits / "registry.yaml").query("page_visits")
    old = tmp_path / "old"
    shutil.copytree(query.checkpoint, old)
    schema = next(p for p in old.glob("state/0/_stateSchema/default/*") if p.name[0] != ".")
    schema.write_bytes(schema.read_bytes()[:-20])
    with pytest.raises(
        TransplantRefused,
        match="the state schemas cannot be compared: .*unreadable state schema file",
    ):
        transplant_checkpoint(old, tmp_path / "new", query)
    assert not (tmp_path / "new").exists()


def test_the_cli_refuses_in_one_line_and_writes_nothing(page_visits, tmp_path):
    old = Path(load_registry(page_visits / "registry.yaml").query("page_visits").checkpoint)
    before = tree_digest(old)
    changed = write_registry(
        tmp_path,
        page_visits={"spark_conf": {"spark.sql.streaming.stateStore.encodingFormat": "avro"}},
    )
    proc = run_cli(
        "--registry",
        str(changed),
        "transplant",
        str(old),
        str(tmp_path / "new"),
        "--query",
        "page_visits",
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: transplant of ") and "encodingFormat" in proc.stderr
    assert not (tmp_path / "new").exists() and tree_digest(old) == before
    assert not carry_over_marker(tmp_path / "new").exists(), "a refused one leaves no proof due"
    with pytest.raises(StateOpsError, match="not empty"):  # and a used folder is never a target
        transplant_checkpoint(
            old, page_visits / "landing", load_registry(changed).query("page_visits")
        )


def test_another_registered_query_s_checkpoint_is_refused(page_visits, tmp_path):
    """page_counts is a transform: nothing but Spark's restart (after a batch is planned)
    would have caught page_visits' state under it."""
    registry = page_visits / "registry.yaml"
    old = Path(load_registry(registry).query("page_visits").checkpoint)
    before = tree_digest(old)
    new = tmp_path / "new"
    proc = run_cli(
        "--registry", str(registry), "transplant", str(old), str(new), "--query", "page_counts"
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        f"error: {old} is query page_visits's checkpoint, not page_counts's: a transplant "
        "carries a query's own state; give --query page_visits\n"
    )
    assert not new.exists() and tree_digest(old) == before


def test_a_new_source_at_a_url_is_kept_as_it_is(page_visits, tmp_path):
    """``--source-path s3a://b/x`` names the new source as it is (it was taken as a folder
    under data_dir: ``<data_dir>/s3a:/b/x``); the dry run's plan names it."""
    old = load_registry(page_visits / "registry.yaml").query("page_visits").checkpoint
    proc = run_cli(
        "--registry",
        str(page_visits / "registry.yaml"),
        "transplant",
        old,
        str(tmp_path / "new"),
        "--source-path",
        "s3a://b/x",
        "--dry-run",
    )
    assert proc.returncode == 0, proc.stderr
    assert " on json s3a://b/x (" in proc.stderr, proc.stderr
    assert not (tmp_path / "new").exists()


def test_a_transform_run_on_another_query_s_state_says_why_and_status_advises_no_run(
    spark, tmp_path
):
    """An unregistered checkpoint of another query, transplanted under a transform: only
    Spark's restart knows a transform's operators. Its refusal is the run's one line with the
    cause, and the status no longer advises the run that fails again."""
    counts = write_registry(tmp_path / "counts")
    land(tmp_path / "counts" / "landing", round_=0, files=2)
    run_in_session(spark, counts, "page_counts")
    old = tmp_path / "old"  # a checkpoint no registry names
    shutil.copytree(load_registry(counts).query("page_counts").checkpoint, old)

    registry = write_registry(
        tmp_path / "views",
        page_counts={"transform": {"function": "shapes:first_views", "output_mode": "append"}},
    )
    raw = yaml.safe_load(registry.read_text())
    raw["code_paths"] = [str(USER_CODE)]
    registry.write_text(yaml.safe_dump(raw, sort_keys=False))
    land(tmp_path / "views" / "landing", round_=1, files=1)
    new = load_registry(registry).query("page_counts").checkpoint
    run_cli(
        "--registry",
        str(registry),
        "transplant",
        str(old),
        new,
        "--query",
        "page_counts",
        check=True,
    )
    last = load_checkpoint(new).last_committed_batch

    code, out = job_in_session(
        spark, "run_query.py", "--registry", str(registry), "--query", "page_counts"
    )
    assert code == 1, out[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["uncommitted_batches"] == [last + 1], summary
    assert summary["error"] == (
        "[STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA] Streaming stateful operator "
        "name does not match with the operator in state metadata. This likely to happen when "
        "user adds/removes/changes stateful operator of existing streaming query. Stateful "
        "operators in the metadata: [(OperatorId: 0 -> OperatorName: stateStoreSave)]; "
        "Stateful operators in current batch: [(OperatorId: 0 -> OperatorName: "
        f"dedupeWithinWatermark)]: {STATE_OF_OTHER_CODE}"
    )
    reasons = query_status(load_registry(registry), "page_counts")["health"]["reasons"]
    assert reasons[0] == f"the last run failed: {summary['error']}", reasons
    assert not any("stateops run page_counts finishes it" in r for r in reasons), reasons
    assert (
        f"batch {last + 1} is planned but not committed: the last run planned it and failed "
        "(above), and a run fails the same way until that is mended: drop it with stateops "
        f"rollback page_counts --to-batch {last}, or run it once mended"
    ) in reasons, reasons
