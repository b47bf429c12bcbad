"""A migration's switch: the registry follows it without the user's file being edited."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from stateops.core.errors import RegistryError
from stateops.core.registry import load_registry, write_partitions, write_switch
from tests.conftest import run_cli, write_registry

pytestmark = pytest.mark.unit

NEW_SOURCE = {
    "format": "parquet",
    "path": "/data/landing-v2/page_visits",
    "schema": "user_id STRING, page STRING, event_time TIMESTAMP, referrer STRING",
}


def test_a_switch_moves_the_query_and_only_its_source_and_checkpoint(tmp_path):
    path = write_registry(tmp_path)
    before = load_registry(path)
    write_switch(before, "page_visits", NEW_SOURCE, str(tmp_path / "ck-v2"), {"run": "m-1"})
    after = load_registry(path)
    q = after.query("page_visits")
    assert q.source.format == "parquet" and q.source.path == NEW_SOURCE["path"]
    assert q.checkpoint == str(tmp_path / "ck-v2")
    old = before.query("page_visits")
    assert q.model_dump(exclude={"source", "checkpoint"}) == old.model_dump(
        exclude={"source", "checkpoint"}
    )
    assert after.query("user_sessions") == before.query("user_sessions")
    assert yaml.safe_load(path.read_text())["queries"]["page_visits"]["source"]["format"] == "json"


def test_a_second_switch_keeps_what_the_file_declares_and_the_history(tmp_path):
    path = write_registry(tmp_path)
    write_switch(load_registry(path), "page_visits", NEW_SOURCE, str(tmp_path / "v2"), {"n": 1})
    third = {**NEW_SOURCE, "path": "/data/landing-v3/page_visits"}
    write_switch(load_registry(path), "page_visits", third, str(tmp_path / "v3"), {"n": 2})
    switch = json.loads(load_registry(path).switch_path("page_visits").read_text())
    assert switch["declared"]["source"]["format"] == "json"  # the file's, not v2's
    assert switch["history"] == [{"n": 1}, {"n": 2}]
    assert load_registry(path).query("page_visits").checkpoint == str(tmp_path / "v3")


def _edit(path: Path, edit) -> None:
    raw = yaml.safe_load(path.read_text())
    edit(raw["queries"]["page_visits"])
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


def test_edits_of_a_switched_entry_apply_over_the_switch(tmp_path):
    """An option, the trigger or the schema edited in the file after a switch: the query stays
    on its new source and checkpoint, with the edit."""
    path = write_registry(tmp_path)
    moved = {**NEW_SOURCE, "options": {"maxFilesPerTrigger": 1, "pathGlobFilter": "*.parquet"}}
    write_switch(load_registry(path), "page_visits", moved, str(tmp_path / "v2"), {})

    def edit(entry: dict) -> None:
        entry["source"]["options"]["maxFilesPerTrigger"] = 5
        entry["trigger"] = {"processing_time": "30 seconds"}

    _edit(path, edit)
    q = load_registry(path).query("page_visits")
    assert (q.checkpoint, q.source.path) == (str(tmp_path / "v2"), NEW_SOURCE["path"])
    assert q.source.options == {"maxFilesPerTrigger": 5, "pathGlobFilter": "*.parquet"}
    assert q.source.schema_ == NEW_SOURCE["schema"]  # the file's old schema was not edited
    assert q.trigger.processing_time == "30 seconds"

    # Removed from the entry: removed from the switched source too.
    _edit(path, lambda entry: entry["source"].pop("options"))
    q = load_registry(path).query("page_visits")
    assert q.source.options == {"pathGlobFilter": "*.parquet"}

    # A next switch (a second migration) starts from the entry as it is now.
    write_switch(load_registry(path), "page_visits", moved, str(tmp_path / "v3"), {})
    q = load_registry(path).query("page_visits")
    assert (q.checkpoint, q.source.options) == (str(tmp_path / "v3"), moved["options"])


def test_an_edit_that_contradicts_the_switch_is_refused_and_one_that_adopts_it_runs(tmp_path):
    path = write_registry(tmp_path)
    write_switch(load_registry(path), "page_visits", NEW_SOURCE, str(tmp_path / "v2"), {})
    _edit(path, lambda entry: entry.update(checkpoint="checkpoints/page_visits-edited"))
    with pytest.raises(RegistryError) as err:
        load_registry(path).query("page_visits")
    message = str(err.value)
    assert "\n" not in message
    assert (
        f"queries.page_visits: the entry reads json {tmp_path}/landing/page_visits on " in message
    )
    assert f"runs it on parquet {NEW_SOURCE['path']} on {tmp_path / 'v2'}" in message
    assert "to adopt the switch, or put back the ones it switched from and undo" in message

    def adopt(entry: dict) -> None:
        entry["source"] = NEW_SOURCE
        entry["checkpoint"] = str(tmp_path / "v2")

    _edit(path, adopt)
    q = load_registry(path).query("page_visits")
    assert (q.checkpoint, q.source.format) == (str(tmp_path / "v2"), "parquet")


def test_a_repartitioned_query_keeps_its_count_through_edits_and_is_not_called_migrated(
    tmp_path,
):
    path = write_registry(tmp_path)
    write_partitions(load_registry(path), "page_visits", 8, {"run": "r-1"})
    _edit(path, lambda entry: entry["source"]["options"].update(maxFilesPerTrigger=3))
    q = load_registry(path).query("page_visits")
    assert (q.shuffle_partitions, q.source.options["maxFilesPerTrigger"]) == (8, 3)
    out = run_cli("--registry", str(path), "queries", check=True).stdout
    assert "switched by a migration" not in out
    assert "8 partitions since a repartition (the entry says 2)" in out

    # It pins no place: the checkpoint restored elsewhere (an S3 undo) and the entry pointed
    # there is where the query runs, with its count.
    _edit(path, lambda entry: entry.update(checkpoint="checkpoints/page_visits-restored"))
    q = load_registry(path).query("page_visits")
    assert q.checkpoint == str(tmp_path / "checkpoints" / "page_visits-restored")
    assert q.shuffle_partitions == 8
    _edit(path, lambda entry: entry.update(shuffle_partitions=8))  # the count adopted
    out = run_cli("--registry", str(path), "queries", check=True).stdout
    assert "partitions since a repartition" not in out


def test_a_damaged_or_invalid_switch_is_a_clear_error(tmp_path):
    path = write_registry(tmp_path)
    switch = write_switch(load_registry(path), "page_visits", NEW_SOURCE, str(tmp_path / "v2"), {})
    switch.write_text("{not json")
    with pytest.raises(RegistryError, match="page_visits.json: unreadable migration switch"):
        load_registry(path).query("page_visits")
    switch.unlink()
    write_switch(load_registry(path), "page_visits", NEW_SOURCE, str(tmp_path / "v2"), {})
    bad = json.loads(switch.read_text())
    bad["current"]["source"]["schema"] = "page STRING"  # no user_id: the key column
    switch.write_text(json.dumps(bad))
    with pytest.raises(RegistryError, match="invalid migration switch"):
        load_registry(path).query("page_visits")


def test_stateops_queries_shows_where_a_switched_query_runs(tmp_path):
    path = write_registry(tmp_path)
    write_switch(load_registry(path), "page_visits", NEW_SOURCE, str(tmp_path / "v2"), {})
    out = run_cli("--registry", str(path), "queries", check=True).stdout
    assert f"page_visits      parquet {NEW_SOURCE['path']}" in out
    assert f"checkpoint {tmp_path / 'v2'}" in out
    assert out.count("switched by a migration") == 1


def test_a_switch_numbers_the_new_checkpoints_output_after_the_old(tmp_path):
    path = write_registry(tmp_path)
    write_switch(
        load_registry(path),
        "page_visits",
        NEW_SOURCE,
        str(tmp_path / "v2"),
        {},
        sink_batch_offset=8,
    )
    sink = load_registry(path).query("page_visits").sink
    assert (sink.batch_offset, sink.folder_batch(0), sink.folder_batch(3)) == (8, 8, 11)
    for k in range(12):  # old checkpoint's batches 0-7, the new one's 0-3
        (Path(sink.path) / f"batch_id={k}").mkdir(parents=True)
    # A rollback of the new checkpoint to its batch 1 moves its batches 2 and 3 only.
    plan = sink.kind.undo_plan(sink, 1)
    assert plan["folders"] == ["batch_id=10", "batch_id=11"]


def test_a_recorded_partition_count_follows_until_the_file_changes_its_count(tmp_path):
    """A repartition's count is recorded with the switch. A migration after it keeps it.
    Editing the count in the file makes the file's count win, and only the count: the
    migration still applies."""
    path = write_registry(tmp_path)  # page_visits: 2 partitions in the file
    write_partitions(load_registry(path), "page_visits", 8, {"run": "r-1"})
    assert load_registry(path).query("page_visits").shuffle_partitions == 8
    write_switch(load_registry(path), "page_visits", NEW_SOURCE, str(tmp_path / "v2"), {})
    migrated = load_registry(path).query("page_visits")
    assert migrated.shuffle_partitions == 8 and migrated.checkpoint == str(tmp_path / "v2")

    raw = yaml.safe_load(path.read_text())
    raw["queries"]["page_visits"]["shuffle_partitions"] = 5
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    edited = load_registry(path).query("page_visits")
    assert edited.shuffle_partitions == 5 and edited.checkpoint == str(tmp_path / "v2")
    write_switch(load_registry(path), "page_visits", NEW_SOURCE, str(tmp_path / "v3"), {})
    assert load_registry(path).query("page_visits").shuffle_partitions == 5


def test_a_migration_carries_the_options_the_new_source_can_take():
    from stateops.core.registry import Source
    from stateops.ops.migration import carried_options

    schema = NEW_SOURCE["schema"]
    kafka = Source.model_validate(
        {
            "format": "kafka",
            "topic": "t",
            "schema": schema,
            "options": {"maxOffsetsPerTrigger": 9, "startingTimestamp": 1},  # the start: not
        }
    )
    files = Source.model_validate(
        {
            "format": "json",
            "path": "/in",
            "schema": schema,
            "options": {"maxFilesPerTrigger": 2, "pathGlobFilter": "*.json", "multiLine": True},
        }
    )
    assert carried_options(kafka, "kafka") == {"maxOffsetsPerTrigger": 9}
    assert carried_options(files, "json") == dict(files.options)
    assert carried_options(files, "parquet") == {"maxFilesPerTrigger": 2}
    assert carried_options(files, "kafka") == carried_options(kafka, "json") == {}


def test_an_upgrade_after_a_migration_is_undone_back_to_the_migration(tmp_path):
    """The undo an upgrade prints after an earlier migration: it removed the switch file, which
    also held the migration (the query went back to its pre-migration checkpoint); now it puts
    back the switch the upgrade replaced."""
    from stateops.ops.migration import undo_recipe

    path = write_registry(tmp_path)
    registry = load_registry(path)
    assert registry.switch_before("page_visits", "m-1") is None  # nothing to replace yet
    write_switch(registry, "page_visits", NEW_SOURCE, str(tmp_path / "v2"), {"run_id": "m-1"})
    registry = load_registry(path)
    before = registry.switch_before("page_visits", "manual__u:1")
    upgraded = registry.query("page_visits").source.model_dump(by_alias=True)
    write_switch(registry, "page_visits", upgraded, str(tmp_path / "v3"), {"run_id": "manual__u:1"})
    assert load_registry(path).query("page_visits").checkpoint == str(tmp_path / "v3")
    plan = {
        "query": "page_visits",
        "switch_file": str(registry.switch_path("page_visits")),
        "switch_before": str(before),
        "old": {"checkpoint": str(tmp_path / "v2")},
    }
    assert f"move {before} over {plan['switch_file']}, run stateops unretire" in undo_recipe(plan)
    Path(before).replace(plan["switch_file"])  # the undo, as it says
    q = load_registry(path).query("page_visits")
    assert (q.checkpoint, q.source.path) == (str(tmp_path / "v2"), NEW_SOURCE["path"])
    assert "remove " in undo_recipe({**plan, "switch_before": None})


def test_of_a_switch_and_its_roll_back_racing_only_the_lease_holder_writes(tmp_path):
    """Airflow failed the switch task while its process lived on (cut off, then back) and
    the roll back started on another host: under the run's hold both are admitted, but each
    step takes the query's lease, so the roll back waits while the switch's is live, and the
    switch that lost it to the roll back switches nothing."""
    import threading

    from stateops.control.lock import QueryLock, hold_query
    from stateops.core.errors import LeaseLostError, LockHeldError

    registry = load_registry(write_registry(tmp_path))
    place = registry.lock_path("page_visits")
    hold_query(place, "page_visits", "migration", "mig-1")
    taken, resume, said = threading.Event(), threading.Event(), []

    def stale_switch() -> None:  # a step's work runs in the thread that took its lease
        with QueryLock(place, "page_visits", "switch", "mig-1", ttl_seconds=0.5) as switch:
            taken.set()
            resume.wait(30)
            switch._stop.set()  # cut off: its renewals stop, its lease runs out
            switch._renewer.join()
            time.sleep(0.6)
            resume.clear()
            taken.set()
            resume.wait(30)  # back, with its plan
            try:
                write_switch(registry, "page_visits", NEW_SOURCE, str(tmp_path / "v2"), {})
            except LeaseLostError as err:
                said.append(str(err))

    switch = threading.Thread(target=stale_switch)
    switch.start()
    assert taken.wait(30)
    with pytest.raises(LockHeldError, match=r"locked by switch \(run mig-1"):
        QueryLock(place, "page_visits", "roll back", "mig-1").acquire()
    taken.clear()
    resume.set()
    assert taken.wait(30)
    with QueryLock(place, "page_visits", "roll back", "mig-1"):
        resume.set()
        switch.join(30)
    assert said and "this switch (run mig-1) lost the query's lease" in said[0], said
    assert not registry.switch_path("page_visits").exists()
