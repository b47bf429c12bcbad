"""`stream_health` of this project's registry (`STATEOPS_REGISTRY`, else
`registry.yaml`), rendered by the factory any project calls (docs/install.md); what it does:
`stateops_airflow.dags.stream_health`."""

from stateops_airflow.dags import lifecycle_dags

globals().update(lifecycle_dags(only=["stream_health"]))
