"""registry.yaml's ``page_visits`` processor as a user's own module: on the registry's
``code_paths`` only, never on ``PYTHONPATH``, so every command that imports it must apply
``code_paths`` (tests/spark/test_migration_run.py migrates it by both roads)."""

from __future__ import annotations

from stateops.pipelines.page_visits import PageVisitsProcessor


class MyVisits(PageVisitsProcessor):
    """The same state and output as ``PageVisitsProcessor``, imported from ``code_paths``."""
