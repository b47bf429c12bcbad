"""The "Streaming state" view (:mod:`stateops_airflow.ui`) for a checkout that runs without
the stateops package installed (the docker image puts ``include/`` on ``PYTHONPATH``). Where
the package is installed, its ``airflow.plugins`` entry point registers the view and this file
registers nothing: Airflow reports a plugin registered twice as an import error."""

from importlib.metadata import entry_points

if not entry_points(group="airflow.plugins", name="stateops_ui"):
    from stateops_airflow.ui import StateOpsUiPlugin  # noqa: F401
