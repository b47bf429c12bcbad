"""stateops: lifecycle operations for stateful Spark Structured Streaming.

The package's folders are its layers, each importing only those listed before it:

- ``core``: the registry, the checkpoint model, the verifier, the inspect report, errors;
- ``control``: the lifecycle lock and holds, the audit log, fault points;
- ``spark``: session and query start, state export, the carry-over proof, Great Expectations,
  the Spark jobs' files (PySpark imported lazily);
- ``ops``: one module per lifecycle operation, each with its plan and its execution;
- ``dev``: the embedded S3 endpoint and sample data, for demos and tests;
- ``status`` and ``cli`` on top; ``pipelines`` holds the reference processors that
  registries name.

The names below are the library's face: ``from stateops import plan_cleanup`` loads
``stateops.ops.cleanup`` on first use only, so importing ``stateops`` costs nothing.
Neither Airflow nor, at module top, PySpark is imported, so planning code is fast and
testable without a JVM.
"""

from importlib import import_module
from typing import Any

__version__ = "0.2.0.dev0"

_FACE = {
    "core.errors": ["StateOpsError"],
    "core.registry": ["Registry", "load_registry"],
    "core.checkpoint": ["load_checkpoint"],
    "core.verify": ["verify_checkpoint"],
    "core.report": ["checkpoint_report"],
    "control.lock": ["QueryLock"],
    "control.audit": ["read_audit"],
    "spark.export": ["export_state"],
    "spark.expectations": ["validate_state"],
    "ops.cleanup": ["plan_cleanup", "run_cleanup"],
    "ops.rollback": ["plan_rollback", "run_rollback"],
    "ops.backup": ["backup_checkpoint", "list_backups", "prune_backups", "run_backup"],
    "ops.restore": ["plan_restore", "restore_backup", "run_restore"],
    "ops.start": ["run_start"],
    "ops.bootstrap": ["plan_bootstrap"],
    "ops.backfill": ["plan_backfill", "run_backfill"],
    "ops.migration": ["plan_migration", "run_migration"],
    "status": ["query_status"],
}
_HOME = {name: module for module, names in _FACE.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'stateops' has no attribute {name!r}")
    return getattr(import_module(f"stateops.{_HOME[name]}"), name)


def __dir__() -> list[str]:
    return [*globals(), *__all__]
