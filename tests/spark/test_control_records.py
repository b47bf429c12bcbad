"""The records one host writes and another acts on, in the S3 control store (issue 55): a
migration's switch and a repartition's count, a run's summary, and a pending carry-over
(beside its checkpoint). Two data folders that share nothing but the control store and the
query's places, as two Airflow workers would; the same records on one host are proven by the
unit tests (tests/unit/test_switch.py, test_start.py, test_bootstrap.py)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

import stateops.core.registry as registry_module
from stateops.control.markers import carry_over_marker, write_carry_over
from stateops.core.errors import RegistryError, StateOpsError
from stateops.core.registry import (
    derived_registry,
    load_registry,
    write_partitions,
    write_switch,
)
from stateops.core.storage import location
from stateops.ops.pending import pending_carry_over
from stateops.ops.start import read_summary, write_summary
from stateops.status import query_status
from tests.spark.harness import two_hosts

pytestmark = pytest.mark.spark  # no JVM: the tier whose workers already run SeaweedFS
NAME = "page_visits"


@pytest.fixture
def hosts(s3a_env, tmp_path) -> tuple[Path, Path]:
    """Host A's and host B's registry files: their own data folders, one control store, and
    the query's input, checkpoint and sink where both see them."""
    control = s3a_env.url(f"fleet-{uuid.uuid4().hex[:8]}")
    shared = tmp_path / "shared"
    return two_hosts(
        tmp_path,
        NAME,
        source=shared / "landing",
        checkpoint=s3a_env.url(f"{control.rsplit('/', 1)[1]}-checkpoint"),
        sink=shared / "output",
        control=control,
    )


def test_a_switch_written_on_one_host_moves_the_query_on_every_host(hosts, s3a_env):
    a, b = hosts
    registry = load_registry(a)
    query = registry.query(NAME)
    write_partitions(registry, NAME, query.shuffle_partitions + 2, {"run_id": "repartition-1"})
    on_b = load_registry(b)
    assert on_b.query(NAME).shuffle_partitions == query.shuffle_partitions + 2
    assert str(on_b.switch_path(NAME)).startswith(str(registry.control))
    assert not (on_b.data_dir / "_stateops" / "switch").exists()
    assert "partitions since a repartition" in on_b.switch_note(NAME)

    new = s3a_env.url(f"moved-{uuid.uuid4().hex[:6]}")
    source = query.source.model_dump(by_alias=True) | {
        "path": str(Path(query.source.path).parent / "new")
    }
    write_switch(load_registry(a), NAME, source, new, {"run_id": "migration-1"}, 7)
    moved = load_registry(b).query(NAME)
    assert (moved.checkpoint, moved.source.path, moved.sink.batch_offset) == (
        new,
        source["path"],
        7,
    )
    assert moved.shuffle_partitions == query.shuffle_partitions + 2, "the count goes on"
    before = load_registry(b).switch_before(NAME, "migration-1")
    kept = json.loads(location(before).read_text())
    assert kept["history"] == [{"run_id": "repartition-1"}], "the switch it replaced, for undo"
    assert load_registry(a, switched=False).query(NAME).checkpoint == query.checkpoint


def test_a_switch_changed_since_it_was_read_is_refused_and_the_other_change_kept(
    hosts, monkeypatch
):
    """Two hosts switch one query at once: each reads the same version; the second write is
    refused by the store (If-Match), so neither change is lost without a word."""
    a, b = hosts
    count = load_registry(a).query(NAME).shuffle_partitions
    write_partitions(load_registry(a), NAME, count + 1, {"run_id": "first"})
    read, on_a = registry_module._switch_record, load_registry(a)

    def raced(path):  # host B writes between host A's read and its write
        seen = read(path)
        monkeypatch.setattr(registry_module, "_switch_record", read)
        write_partitions(load_registry(b), NAME, count + 3, {"run_id": "other-host"})
        return seen

    monkeypatch.setattr(registry_module, "_switch_record", raced)
    with pytest.raises(StateOpsError) as refused:
        write_partitions(on_a, NAME, count + 2, {"run_id": "this-host"})
    said = str(refused.value)
    assert "\n" not in said and "changed while this run wrote it" in said
    assert f"stateops status {NAME}" in said
    assert load_registry(a).query(NAME).shuffle_partitions == count + 3, "B's change stands"
    history = json.loads(load_registry(a).switch_path(NAME).read_text())["history"]
    assert [h["run_id"] for h in history] == ["first", "other-host"]


def test_a_run_summary_written_by_a_driver_is_read_by_run_id_on_another_host(hosts):
    a, b = hosts
    write_summary(
        load_registry(a), {"query": NAME, "run_id": "scheduled__1", "status": "succeeded"}
    )
    write_summary(load_registry(a), {"query": NAME, "run_id": "scheduled__2", "status": "failed"})
    on_b = load_registry(b)
    assert read_summary(on_b, NAME, "scheduled__1")["status"] == "succeeded"
    assert str(on_b.run_summary_path(NAME, "scheduled__1")).startswith(str(on_b.control))
    assert query_status(on_b, NAME)["last_run"]["status"] == "failed", "the latest, on B"
    with pytest.raises(StateOpsError, match="no summary of run 'scheduled__3'"):
        read_summary(on_b, NAME, "scheduled__3")


def test_a_pending_carry_over_follows_its_checkpoint_to_any_host(hosts):
    a, b = hosts
    checkpoint = load_registry(a).query(NAME).checkpoint
    record = {"road": "initial_state", "checkpoint": checkpoint, "batch": None}
    write_carry_over(checkpoint, record)
    assert str(carry_over_marker(checkpoint)).endswith(".audit/carry_over.json")
    assert pending_carry_over(load_registry(b).query(NAME), None) == record, "seen on B"
    assert pending_carry_over(load_registry(b).query(NAME), 0) is None, "batch 0: settled"
    assert not carry_over_marker(checkpoint).exists()


def test_a_run_s_own_registry_is_written_to_the_control_store_and_read_on_any_host(hosts):
    """A backfill's overrides (or a migration's new place) are the registry its later steps
    run with (``--registry s3://...``), whichever host they land on."""
    a, b = hosts
    on_a = load_registry(a)
    place = on_a.run_registry_path(NAME, "backfill", "manual__2026-11-28T10:00:00+00:00")
    assert str(place).startswith(f"{on_a.control}/{NAME}/work/")
    with pytest.raises(RegistryError, match="shuffle_partitions"):
        derived_registry(on_a, NAME, {"shuffle_partitions": 0}, place)
    assert not place.exists(), "an invalid change writes nothing"
    spark_conf = {"spark.sql.session.timeZone": "UTC"}
    written = derived_registry(on_a, NAME, {"spark_conf": spark_conf}, place)
    run = load_registry(str(written))  # as a step on host B reads it (no data folder shared)
    assert run.query(NAME).spark_conf == spark_conf and run.derived_from == a
    assert run.query(NAME).logic != on_a.query(NAME).logic, "another logic, another digest"
    assert load_registry(b).query(NAME).logic == on_a.query(NAME).logic
    with pytest.raises(RegistryError, match="no such registry"):
        load_registry(str(place.with_name("other.yaml")))


def test_history_points_written_at_once_from_both_hosts_are_all_kept(hosts):
    """A run's driver and a health check append to the same day's file in the control store at
    the same moment: each append is a conditional write, so none is lost; both hosts read
    every point (stateops.control.history; one host's file: tests/unit/test_history.py)."""
    from concurrent.futures import ThreadPoolExecutor
    from datetime import UTC, datetime, timedelta

    from stateops.control.history import read_history, record

    registries = [load_registry(path) for path in hosts]
    folder = registries[0].history_path(NAME)
    assert str(folder) == f"{registries[0].control}/{NAME}/history"
    now = datetime.now(UTC)

    def append(n: int) -> None:
        point = {"at": now.isoformat(), "source": "run", "run_id": f"r{n}", "state_rows": n}
        record(registries[n % 2], NAME, point)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(append, range(24)))
    for registry in registries:
        points = read_history(registry, NAME, now - timedelta(minutes=1))
        assert sorted(p["run_id"] for p in points) == sorted(f"r{n}" for n in range(24))


def test_a_switch_whose_answer_was_lost_is_not_called_refused(hosts, s3a_env, monkeypatch):
    """The store applied the switch's conditional write and its answer was lost; the SDK's
    retry of the same write is refused (412: the version it names is gone, replaced by this
    very write). The switch reads back its own record and says it is switched."""
    from tests.s3proxy import S3Proxy

    def meddle(command: str, path: str, forward):
        answer = forward()
        if command == "PUT" and path.split("?")[0].endswith("/switch.json") and answer[0] == 200:
            return 412, [], b"<Error><Code>PreconditionFailed</Code></Error>"
        return answer

    proxy = S3Proxy(s3a_env.port, meddle)
    a, b = hosts
    new = s3a_env.url(f"moved-{uuid.uuid4().hex[:6]}")
    try:
        monkeypatch.setenv("STATEOPS_S3_ENDPOINT_URL", proxy.endpoint)
        registry = load_registry(a)
        source = registry.query(NAME).source.model_dump(by_alias=True)
        write_switch(registry, NAME, source, new, {"run_id": "migration-1"}, 3)
    finally:
        proxy.shutdown()
    monkeypatch.setenv("STATEOPS_S3_ENDPOINT_URL", s3a_env.endpoint)
    assert load_registry(b).query(NAME).checkpoint == new
