"""The provider's metadata (the ``apache_airflow_provider`` entry point): what Airflow lists
for the package under Admin > Providers. The "Streaming state" view is registered by the
``airflow.plugins`` entry point instead (listed here too, it would be loaded twice)."""

from __future__ import annotations

from typing import Any

__all__ = ["get_provider_info"]


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "stateops",
        "name": "stateops",
        "description": "Lifecycle operations for stateful Spark Structured Streaming: bootstrap, "
        "start and stop, backup and restore, cleanup, rollback and backfill, source migration "
        "with state carry-over.",
        "integrations": [{"integration-name": "stateops", "tags": ["apache", "software"]}],
        "operators": [
            {
                "integration-name": "stateops",
                "python-modules": ["stateops_airflow.approval", "stateops_airflow.tasks"],
            }
        ],
    }
