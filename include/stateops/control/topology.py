"""Whether the hosts that operate a registry's queries can share their leases.

Without a control store (the registry's ``control``), a query's lease, its stop requests and
its records are files under ``data_dir`` on the host that acts: sound where every task and
every Spark driver runs on one host (Airflow's LocalExecutor, drivers in client mode), or on
hosts that mount one POSIX folder there (NFS, EFS: ``STATEOPS_SHARED_DATA_DIR=posix`` says so).
Anywhere else (Celery or Kubernetes executors, a driver in cluster deploy mode) each host would
grant the lock from its own disk: refused, in one line, before anything runs
(docs/deployment.md).
"""

from __future__ import annotations

import os

from stateops.core.errors import StateOpsError
from stateops.core.registry import Registry

__all__ = ["refuse_unshared_control"]

# Executors that run every task on the scheduler's host.
_ONE_HOST = ("LocalExecutor", "SequentialExecutor", "DebugExecutor")


def refuse_unshared_control(
    registry: Registry, executor: str | None, deploy_mode: str | None = None
) -> None:
    """Refuse a registry without a control store under ``executor`` (Airflow's
    ``core.executor``: a name, a class path, or a comma-separated list) when it may run tasks
    on another host, or under a Spark ``deploy_mode`` of ``cluster`` (the driver on a cluster
    node)."""
    if registry.control or os.environ.get("STATEOPS_SHARED_DATA_DIR") == "posix":
        return
    elsewhere = [
        name.strip()
        for name in (executor or "").split(",")
        if name.strip() and name.strip().rpartition(".")[2].split(":")[0] not in _ONE_HOST
    ]
    why = (
        f"Airflow's executor {elsewhere[0]} runs tasks on other hosts"
        if elsewhere
        else "Spark's deploy mode cluster runs the driver on a cluster node"
        if (deploy_mode or "").strip().lower() == "cluster"
        else None
    )
    if why:
        raise StateOpsError(
            f"{registry.path}: {why}, and the queries' leases are files under {registry.data_dir} "
            "on each host, so they would exclude nothing: set control: s3://BUCKET/PREFIX in "
            "the registry (docs/deployment.md), or, where every host mounts that folder (NFS), "
            "set STATEOPS_SHARED_DATA_DIR=posix"
        )
