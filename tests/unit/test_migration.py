"""The migration's choice of a new checkpoint folder and its refusals, without Spark."""

from __future__ import annotations

import json

import pytest
import yaml

from stateops.control.target import query_target
from stateops.core.errors import StateOpsError
from stateops.core.registry import load_registry
from stateops.ops.migration import check_migration_form, default_checkpoint, plan_migration
from tests.conftest import run_cli, tree_digest, write_registry

pytestmark = pytest.mark.unit


def test_the_default_new_checkpoint_is_the_first_free_version_beside_the_old(tmp_path):
    query = load_registry(write_registry(tmp_path)).query("page_visits")
    old = tmp_path / "checkpoints" / "page_visits"
    assert query.checkpoint == str(old)
    assert default_checkpoint(query) == old.with_name("page_visits.v2")
    (old.with_name("page_visits.v2") / "commits").mkdir(parents=True)  # taken
    old.with_name("page_visits.v3").mkdir()  # empty: free
    assert default_checkpoint(query) == old.with_name("page_visits.v3")
    moved = query.model_copy(update={"checkpoint": str(old.with_name("page_visits.v3"))})
    assert default_checkpoint(moved) == old.with_name("page_visits.v2").with_name(
        "page_visits.v4"
    ), "numbered on from the stem, never .v3.v2"


@pytest.mark.parametrize(
    ("inputs", "carry_over", "moving", "says"),
    [
        (
            {"source": "s"},
            "initial_state",
            "",
            "^carry_over initial_state is for processors "
            r"\(handleInitialState\); page_counts is a transform, whose state moves by transplant",
        ),
        (
            {"sources": {"views": "s", "events": "s"}},
            "auto",
            "",
            r"^source: query page_counts reads 2 sources \(events, views\): "
            r"name the one that moves$",
        ),
        (
            {"sources": {"views": "s", "events": "s"}},
            "auto",
            "clicks",
            r"^source: query page_counts has no source 'clicks': its sources are events, views$",
        ),
        (
            {"source": "s"},
            "auto",
            "views",
            r"^source: query page_counts has no source 'views': "
            r"it "
            r"reads one source: leave the source name empty$",
        ),
    ],
)
def test_a_transform_moves_its_state_by_transplant_one_named_source_at_a_time(
    tmp_path, inputs, carry_over, moving, says
):
    path = write_registry(tmp_path / "data")
    raw = yaml.safe_load(path.read_text())
    visits = raw["queries"]["page_visits"]["source"]
    raw["queries"]["page_counts"] = {
        **{k: visits if v == "s" else {n: visits for n in v} for k, v in inputs.items()},
        "sink": {"path": "output/page_counts"},
        "transform": {"function": "stateops.pipelines.page_counts:build"},
        "checkpoint": "checkpoints/page_counts",
    }
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(StateOpsError, match=says):
        plan_migration(
            query_target(path, "page_counts"),
            {"path": "landing/elsewhere"},
            carry_over=carry_over,
            moved_source=moving,
        )
    assert not (tmp_path / "data" / "checkpoints").exists()


@pytest.mark.parametrize(
    ("new_path", "cutover", "says"),
    [
        (
            "landing/page_visits/v2",
            "drain",
            r"^new_source_path: new source folder "
            r".*landing/page_visits/v2 "
            r"overlaps the folder of page_counts's source views \(.*landing/page_visits\): land "
            "the new source's input in a folder of its own$",
        ),
        (
            "landing/events_v2",
            "2026-01-01T00:00:00Z",
            r"^cutover: a cutover time reads one "
            r"source up "
            "to it; page_counts reads 2: choose cutover drain$",
        ),
    ],
)
def test_moving_one_source_of_a_join_keeps_the_others_apart(tmp_path, new_path, cutover, says):
    """The transplant tells the sources apart by their folders, and a cutover time cuts one."""
    path = write_registry(tmp_path / "data")
    raw = yaml.safe_load(path.read_text())
    visits = raw["queries"]["page_visits"]["source"]
    raw["queries"]["page_counts"] = {
        "sources": {"views": visits, "events": {**visits, "path": "landing/user_sessions"}},
        "sink": {"path": "output/page_counts"},
        "transform": {"function": "stateops.pipelines.page_counts:build"},
        "checkpoint": "checkpoints/page_counts",
    }
    path.write_text(yaml.safe_dump(raw))
    (tmp_path / "data" / new_path).mkdir(parents=True)
    with pytest.raises(StateOpsError, match=says):
        plan_migration(
            query_target(path, "page_counts"),
            {"path": new_path, "format": "json"},
            cutover=cutover,
            moved_source="events",
        )
    assert not (tmp_path / "data" / "checkpoints").exists()


def test_stateops_migrate_names_the_source_that_moves(tmp_path):
    path = write_registry(tmp_path / "data")
    proc = run_cli(
        "--registry",
        str(path),
        "migrate",
        "page_visits",
        "--source",
        "clicks",
        "--new-source-path",
        "landing/v2",
        "--dry-run",
    )
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: source: query page_visits has no source 'clicks': it reads one source: leave the "
        "source name empty"
    ), proc.stderr


def test_an_s3_checkpoints_new_checkpoint_is_the_first_free_prefix_beside_it(
    tmp_path, s3, monkeypatch
):
    """A query whose checkpoint is in S3 migrates (docs/migration-on-s3.md): its default new
    checkpoint is the first free prefix beside the old one; a prefix with objects is taken,
    and one holding a failed run's checkpoint set aside is refused saying so."""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("STATEOPS_CHECKPOINT_CONN_ID", raising=False)
    old = f"s3://backups/{tmp_path.name}/page_visits"
    path = write_registry(tmp_path, page_visits={"checkpoint": old})
    query = load_registry(path).query("page_visits")
    assert str(default_checkpoint(query)) == f"{old}.v2"
    client = s3.client()
    client.put_object(Bucket="backups", Key=f"{tmp_path.name}/page_visits.v2/metadata", Body=b"{}")
    assert str(default_checkpoint(query)) == f"{old}.v3"
    held = {"state": "set aside", "run_id": "m-1", "query": "page_visits"}
    key = f"{tmp_path.name}/page_visits.v2.audit/retired.json"
    client.put_object(Bucket="backups", Key=key, Body=json.dumps(held).encode())
    (tmp_path / "landing" / "v2").mkdir(parents=True)
    (tmp_path / "landing" / "v2" / "part-0.json").write_bytes(JSON_LINE)
    conf = {"query": "page_visits", "new_source_path": "landing/v2"}
    target = query_target(path, "page_visits")
    check_migration_form(target, conf)  # the default: .v3
    given = f"s3a://backups/{tmp_path.name}/page_visits.v2"
    with pytest.raises(
        StateOpsError,
        match=rf"^new_checkpoint: new checkpoint {old}.v2 holds the checkpoint of failed "
        r"migration run m-1, set aside: name another",
    ):
        check_migration_form(target, {**conf, "new_checkpoint": given})


def _parquet_bytes() -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    out = io.BytesIO()
    time = pa.array([0], pa.timestamp("us", "UTC"))
    pq.write_table(pa.table({"user_id": ["u1"], "page": ["/"], "event_time": time}), out)
    return out.getvalue()


JSON_LINE = b'{"user_id": "u1", "page": "/", "event_time": "2026-01-01T00:00:00Z"}\n'
CSV_LINES = b"user_id,page,event_time\nu1,/,2026-01-01T00:00:00Z\n"


@pytest.mark.parametrize(
    ("files", "given", "says"),
    [
        (
            {"part-0.json": JSON_LINE},
            "parquet",
            r"^new_source_format: .*/v2/part-0.json is a json "
            r"file, but the new source's format is parquet: give the format of its files "
            r"\(--new-source-format json\), or land only parquet files there$",
        ),
        (
            {"part-0": JSON_LINE, "day=1/part-1.parquet": b"PAR1"},
            "parquet",
            r"^new_source_format: .*/v2/part-0 is a json file",
        ),  # not by its name, by its bytes
        (
            {"a.parquet": "parquet", "b.parquet": "parquet"},
            "csv",
            r"^new_source_format: .*/v2/a.parquet is a parquet file, but the new source's format "
            r"is csv: give the format of its files \(--new-source-format parquet\)",
        ),
        ({"a.csv": CSV_LINES}, "json", r"^new_source_format: .*/v2/a.csv is a csv file"),
        ({"a.json.gz": "gzip"}, "csv", r"^new_source_format: .*/v2/a.json.gz is a json file"),
        (
            {"a.json": JSON_LINE, "b.parquet": "parquet"},
            None,
            r"^new_source_format: .*/v2 holds json files \(a.json\) and parquet files "
            r"\(b.parquet\): land one format in the new source's folder$",
        ),
        (
            {"a.orc": b"ORC\x00\x01\x02"},
            "auto",
            r"^new_source_format: the files in .*/v2 "
            r"\(a.orc, ...\) are not parquet, JSON or CSV by their first bytes: give the new "
            r"source's format \(--new-source-format\)$",
        ),
    ],
)
def test_files_of_another_format_than_the_new_sources_are_refused_before_anything_stops(
    tmp_path, files, given, says
):
    """Spark would fail at the new source's first batch, after the drain (issue 40): the
    preflight reads each file's first bytes instead, and no checkpoint is read."""
    import gzip

    path = write_registry(tmp_path / "data")
    folder = tmp_path / "data" / "landing" / "v2"
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        data = {"parquet": _parquet_bytes(), "gzip": gzip.compress(JSON_LINE)}.get(content)
        (folder / name).write_bytes(data or content)
    (folder / "_SUCCESS").write_bytes(b"")  # hidden from Spark's file source, and from this
    (folder / ".part-0.json.crc").write_bytes(b"\x00crc")
    conf = {"query": "page_visits", "new_source_path": "landing/v2", "new_source_format": given}
    with pytest.raises(StateOpsError, match=says):
        check_migration_form(query_target(path, "page_visits"), conf)
    with pytest.raises(StateOpsError, match=says):
        plan_migration(query_target(path, "page_visits"), {"path": "landing/v2", "format": given})
    assert not (tmp_path / "data" / "checkpoints").exists()


@pytest.mark.parametrize(
    ("name", "content", "found"),
    [("a.json", JSON_LINE, "json"), ("a", CSV_LINES, "csv"), ("x.bin", "parquet", "parquet")],
)
def test_without_a_format_the_new_source_takes_its_files_format(tmp_path, name, content, found):
    path = write_registry(tmp_path / "data")
    folder = tmp_path / "data" / "landing" / "v2"
    folder.mkdir(parents=True)
    (folder / name).write_bytes(_parquet_bytes() if content == "parquet" else content)
    target = query_target(path, "page_visits")
    for given in (None, "auto", found):
        check_migration_form(
            target,
            {"query": "page_visits", "new_source_path": "landing/v2", "new_source_format": given},
        )
    other = "csv" if found != "csv" else "json"
    with pytest.raises(
        StateOpsError, match=f"is a {found} file, but the new source's format is {other}: "
    ):
        check_migration_form(
            target,
            {"query": "page_visits", "new_source_path": "landing/v2", "new_source_format": other},
        )


def test_stateops_migrate_dry_run_to_json_files_as_parquet_is_refused_in_one_line(tmp_path):
    """The dry run of issue 40: the new folder holds JSON files, the format says parquet."""
    path = write_registry(tmp_path / "data")
    folder = tmp_path / "data" / "landing" / "v2"
    folder.mkdir(parents=True)
    (folder / "part-0.json").write_bytes(JSON_LINE)
    before = tree_digest(tmp_path)
    proc = run_cli(
        "--registry",
        str(path),
        "migrate",
        "page_visits",
        "--new-source-path",
        "landing/v2",
        "--new-source-format",
        "parquet",
        "--dry-run",
    )
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr.splitlines() == [
        f"error: new_source_format: {folder}/part-0.json is a json file, but the new source's "
        "format is parquet: give the format of its files (--new-source-format json), or land "
        "only parquet files there"
    ], proc.stderr
    assert tree_digest(tmp_path) == before


def test_the_new_sources_glob_filter_is_read_as_spark_reads_it(tmp_path):
    """Hadoop's ``{a,b}`` alternatives and an option name in any case: a filter read as
    Python's fnmatch reads it matched nothing, and JSON files passed as parquet (review)."""
    path = write_registry(tmp_path / "data")
    folder = tmp_path / "data" / "landing" / "v2"
    folder.mkdir(parents=True)
    (folder / "part-0.json").write_bytes(JSON_LINE)
    target = query_target(path, "page_visits")
    conf = {"query": "page_visits", "new_source_path": "landing/v2"}
    for name in ("pathGlobFilter", "PATHGLOBFILTER"):
        options = {name: "*.{jsonl,json}"}
        with pytest.raises(StateOpsError, match="is a json file, but the new source's format "):
            check_migration_form(
                target, {**conf, "new_source_format": "parquet", "new_source_options": options}
            )
        for given in (None, "json"):  # without a format it takes its files' (json) format
            check_migration_form(
                target, {**conf, "new_source_format": given, "new_source_options": options}
            )
    with pytest.raises(
        StateOpsError,
        match=r"^new_source_options: pathGlobFilter '\*.parquet' "
        r"matches none of the 1 files in .*v2 \(e.g. "
        r"part-0.json\): fix the filter, or land files it "
        r"matches$",
    ):
        check_migration_form(
            target, {**conf, "new_source_options": {"pathGlobFilter": "*.parquet"}}
        )


@pytest.mark.parametrize("url", ["s3a://backups/{}/pv.v2", "s3://backups/{}/pv"])
def test_a_new_checkpoint_given_as_a_url_stays_a_url_not_a_local_folder(
    tmp_path, url, s3, monkeypatch
):
    """A path the user wrote is read by the registry's one rule (a URL as it is, else relative
    to data_dir): the URL stays a URL, a new S3 prefix for the new checkpoint, instead of
    ``<data_dir>/s3a:/...``."""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("STATEOPS_CHECKPOINT_CONN_ID", raising=False)
    url = url.format(tmp_path.name)
    path = write_registry(tmp_path / "data")
    folder = tmp_path / "data" / "landing" / "v2"
    folder.mkdir(parents=True)
    (folder / "part-0.json").write_bytes(JSON_LINE)
    target = query_target(path, "page_visits")
    conf = {"query": "page_visits", "new_source_path": "landing/v2", "new_checkpoint": url}
    check_migration_form(target, conf)
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["landing", "registry.yaml"]
