"""Thin Airflow wrappers around the stateops library, for the project's DAG files."""
