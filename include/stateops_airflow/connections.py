"""The registry's Airflow connections, resolved where a task runs (docs/connections.md).

Airflow finds a connection in its secrets backend, its environment or its database; the AWS
hook (``apache-airflow-providers-amazon``) turns an ``aws`` connection into credentials by role
assumption, web identity, a profile or the instance's own role. What they resolved is handed
to the library in this task's process and to the Spark jobs it starts as ``AIRFLOW_CONN_<ID>``
variables of its environment, the form :mod:`stateops.core.s3` and :mod:`stateops.core.kafka`
read: never on a command line (``ps``, the task log), and the AWS hook masks the secret and the
session token in the task's log.

Temporary credentials (an assumed role) are resolved once per task: they must outlive it (a
role's session lasts an hour by default; ``stream_start``'s run window is shorter).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from stateops.core.errors import StateOpsError, one_line
from stateops.core.registry import Registry
from stateops.core.s3 import CHECKPOINT_CONN_ENV, S3Settings, use_checkpoint_connection

__all__ = ["publish", "s3_client", "s3_settings"]


def _extra(conn_id: str, kind: str, named_by: str) -> dict[str, Any] | None:
    """Connection ``conn_id``'s extra, None where Airflow has no such connection."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None
    if conn.conn_type and conn.conn_type != kind:
        raise StateOpsError(
            f"connection {conn_id!r} ({named_by}) is of type {conn.conn_type}; it must be a "
            f"{kind} connection"
        )
    return conn.extra_dejson


def s3_settings(conn_id: str, named_by: str = "the registry") -> S3Settings:
    """Airflow ``aws`` connection ``conn_id`` as the library's settings, through Airflow's AWS
    hook: its credentials (the keys, or those of the role it assumes), its region, its
    endpoint and addressing style. A connection Airflow does not know is refused in one line
    (``named_by``: the registry field that names it)."""
    try:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    except ImportError:
        raise StateOpsError(
            f"connection {conn_id!r} ({named_by}): an aws connection needs Airflow's Amazon "
            "provider: pip install 'stateops[airflow]' (or apache-airflow-providers-amazon)"
        ) from None

    from stateops.core.s3 import connection_settings

    extra = _extra(conn_id, "aws", named_by)
    if extra is None:
        raise StateOpsError(
            f"connection {conn_id!r} ({named_by}) is not defined in Airflow: add it (type aws) "
            "in the UI, `airflow connections add`, a secrets backend or AIRFLOW_CONN_"
            f"{conn_id.upper()}"
        )
    hook = AwsBaseHook(aws_conn_id=conn_id, client_type="s3")
    wrapper = hook.conn_config
    try:
        credentials = hook.get_credentials()  # masked in the task's log from here on
    except AttributeError:  # no credentials anywhere: the SDKs' own chain decides
        credentials = None
    except Exception as err:  # noqa: BLE001 - STS and botocore errors alike, said in one line
        raise StateOpsError(
            f"connection {conn_id!r} ({named_by}): no credentials ({one_line(err)})"
        ) from None
    base = connection_settings(None, None, wrapper.extra_config)
    style = (getattr(wrapper.botocore_config, "s3", None) or {}).get("addressing_style")
    return dataclasses.replace(
        base,
        endpoint_url=wrapper.get_service_endpoint_url("s3") or base.endpoint_url,
        region=wrapper.region_name or base.region,
        access_key=credentials and credentials.access_key,
        secret_key=credentials and credentials.secret_key,
        session_token=credentials and credentials.token,
        addressing_style=style or base.addressing_style,
    )


def s3_client(conn_id: str, named_by: str = "the registry") -> Any:
    """An S3 client of Airflow connection ``conn_id`` (:func:`s3_settings`)."""
    from stateops.core.s3 import s3_client as client

    return client(s3_settings(conn_id, named_by))


def publish(registry: Registry) -> None:
    """Hand ``registry``'s connections to this process and the Spark jobs it starts: its
    checkpoint store's (``connections.checkpoint``, else the deployment's
    ``STATEOPS_CHECKPOINT_CONN_ID``) resolved by the AWS hook, and the Kafka connection of
    each of its Kafka sources and sinks. Nothing is logged."""
    from stateops.core.kafka import publish_connection
    from stateops.core.s3 import as_connection

    checkpoint = registry.connections.checkpoint or os.environ.get(CHECKPOINT_CONN_ENV)
    if checkpoint:
        named_by = (
            "the registry's connections.checkpoint"
            if registry.connections.checkpoint
            else CHECKPOINT_CONN_ENV
        )
        os.environ[f"AIRFLOW_CONN_{checkpoint.upper()}"] = as_connection(
            s3_settings(checkpoint, named_by)
        )
        use_checkpoint_connection(checkpoint)
    for conn_id in sorted(_kafka_connections(registry)):
        publish_connection(conn_id, lambda c: _extra(c, "kafka", "a Kafka source or sink"))


def _kafka_connections(registry: Registry) -> set[str]:
    found = {registry.connections.kafka}
    for query in registry.queries.values():
        places = [query.sink, *([query.source] if query.source else query.sources.values())]
        found |= {
            p.connection for p in places if p.kind.connection_type == "kafka" and p.connection
        }
    return found
