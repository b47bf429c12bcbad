"""DAGs from the user's registry (issue 75 item 2): `stateops_airflow.dags.lifecycle_dags`
called from a file of the user's own DAGs folder renders the lifecycle DAGs of one registry,
ids prefixed, with the deployment's tags, owner and access control; two registries live in one
Airflow, each task pointed at its own. The project's dags/ are the same calls
(test_dagbag.py); runs of them: every DAG test."""

from __future__ import annotations

import os

import pytest

from stateops.core.errors import StateOpsError
from stateops_airflow.dags import DAG_NAMES, lifecycle_dags
from tests.conftest import write_registry

pytestmark = pytest.mark.dag


def test_two_registries_live_in_one_airflow_each_task_pointed_at_its_own(tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    a, b = write_registry(tmp_path / "a"), write_registry(tmp_path / "b")
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "teams.py").write_text(
        "from stateops_airflow.dags import lifecycle_dags\n\n"
        f"globals().update(lifecycle_dags({str(a)!r}, prefix='team_a_', tags=['team-a'],\n"
        "    owner='alice', access_control={'team_a': {'DAGs': {'can_read', 'can_edit'}}}))\n"
        f"globals().update(lifecycle_dags({str(b)!r}, prefix='team_b_',\n"
        "    only=['stream_start', 'stream_health']))\n"
    )
    monkeypatch.delenv("STATEOPS_REGISTRY", raising=False)
    bag = DagBag(dag_folder=str(dags))
    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == sorted(
        [f"team_a_{n}" for n in DAG_NAMES] + ["team_b_stream_start", "team_b_stream_health"]
    )
    assert "STATEOPS_REGISTRY" not in os.environ, "the parse leaves the environment as it was"

    start = bag.dags["team_a_stream_start"]
    assert start.tags >= {"stateops", "streaming", "start", "team-a"}
    assert start.access_control == {"team_a": {"DAGs": {"can_read", "can_edit"}}}
    assert start.fileloc == str(dags / "teams.py")
    for dag_id, registry in [("team_a_stream_start", a), ("team_b_stream_start", b)]:
        for task in bag.dags[dag_id].tasks:
            assert task.owner == ("alice" if dag_id.startswith("team_a") else "airflow")
            task._pre_execute_hook({})  # what the task's process does before it runs
            assert os.environ["STATEOPS_REGISTRY"] == str(registry)
            if hasattr(task, "application_args"):  # the Spark job reads the same registry
                assert task.application_args[:2] == ["--registry", str(registry)]
    # A DAG's own pre_execute hook still runs after the registry's.
    migration = bag.dags["team_a_stream_source_migration"].tasks[0]
    assert migration._pre_execute_hook.then is None
    assert migration._post_execute_hook.__name__ == "inject_fault"


def test_a_bad_factory_argument_is_refused_in_one_line(tmp_path):
    registry = write_registry(tmp_path)
    with pytest.raises(StateOpsError, match="^only: stream_nope: not a lifecycle DAG"):
        lifecycle_dags(registry, only=["stream_nope"])
    with pytest.raises(StateOpsError, match="^prefix 'team a': letters, digits"):
        lifecycle_dags(registry, prefix="team a")


def test_a_query_with_its_own_schedule_has_its_scheduled_dags_to_itself(tmp_path):
    from datetime import timedelta

    own = {"start": "5 minutes", "backup": "@hourly"}
    registry = write_registry(tmp_path, page_visits={"schedules": own})
    dags = lifecycle_dags(registry, prefix="t_")
    assert {"t_stream_start__page_visits", "t_stream_checkpoint_backup__page_visits"} <= set(dags)
    assert not any(d.endswith("__page_visits") for d in dags if "cleanup" in d)

    apart = dags["t_stream_start__page_visits"]
    assert apart.schedule == timedelta(minutes=5)
    assert {t.task_id for t in apart.tasks} == {"run_page_visits", "record_page_visits"}
    shared = dags["t_stream_start"]
    assert "run_page_visits" not in {t.task_id for t in shared.tasks}
    assert {t.task_id for t in shared.tasks} >= {"run_user_sessions", "record_user_sessions"}
    assert dags["t_stream_checkpoint_backup__page_visits"].schedule == "@hourly"
    assert dags["t_stream_checkpoint_backup"].schedule == "@daily"
    cleanup = {t.task_id for t in dags["t_stream_snapshot_cleanup"].tasks}
    assert any("page_visits" in t for t in cleanup), "no cleanup of its own: the shared one"
