"""The refusal of a fleet whose leases are on local disk (stateops.control.topology)."""

from __future__ import annotations

import pytest
import yaml

from stateops.control.topology import refuse_unshared_control
from stateops.core.errors import StateOpsError
from stateops.core.registry import load_registry
from tests.conftest import write_registry

pytestmark = pytest.mark.unit

ONE_HOST = [
    ("LocalExecutor", None),
    (None, None),
    ("airflow.executors.local_executor.LocalExecutor", "client"),
    ("my_local:airflow.executors.local_executor.LocalExecutor", None),
]
FLEET = [
    ("CeleryExecutor", None, "Airflow's executor CeleryExecutor runs tasks on other hosts"),
    (
        "LocalExecutor,airflow.providers.cncf.kubernetes.executors.kubernetes_executor."
        "KubernetesExecutor",
        None,
        "Airflow's executor airflow.providers.cncf.kubernetes",
    ),
    ("LocalExecutor", "cluster", "Spark's deploy mode cluster runs the driver on a cluster node"),
]


@pytest.fixture
def local(tmp_path, monkeypatch):
    monkeypatch.delenv("STATEOPS_SHARED_DATA_DIR", raising=False)
    return load_registry(write_registry(tmp_path))


@pytest.mark.parametrize(("executor", "deploy_mode"), ONE_HOST)
def test_one_host_is_allowed(local, executor, deploy_mode):
    refuse_unshared_control(local, executor, deploy_mode)


@pytest.mark.parametrize(("executor", "deploy_mode", "why"), FLEET)
def test_a_fleet_without_a_control_store_is_refused_in_one_line(local, executor, deploy_mode, why):
    with pytest.raises(StateOpsError) as refused:
        refuse_unshared_control(local, executor, deploy_mode)
    said = str(refused.value)
    assert "\n" not in said and why in said
    assert "set control: s3://BUCKET/PREFIX in the registry" in said


def test_a_control_store_or_a_shared_folder_allows_a_fleet(local, tmp_path, monkeypatch):
    path = write_registry(tmp_path / "fleet")
    raw = yaml.safe_load(path.read_text())
    raw["control"] = "s3://control/prefix"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    refuse_unshared_control(load_registry(path, switched=False), "CeleryExecutor", "cluster")
    monkeypatch.setenv("STATEOPS_SHARED_DATA_DIR", "posix")
    refuse_unshared_control(local, "CeleryExecutor", "cluster")
