"""The Spark jobs' refusals that need no Spark, run before ``spark-submit`` starts a JVM.

Each job in ``spark_jobs/`` defines ``parse_args(argv)`` and ``preflight(args)``: its
``main()`` runs them first (a job may be submitted by hand), and the CLI and the Airflow
operator run the very same two on the arguments they are about to submit, so a bad path,
registry, batch or output folder is refused in a second instead of after 10-15 s of JVM
start-up, and the checks cannot drift apart from the job's own.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from stateops.core.errors import StateOpsError
from stateops.core.registry import PROJECT_ROOT

__all__ = ["PY_FILES", "job_path", "load_job", "preflight_job"]

# The library as the Spark executors get it (``--py-files``; ``make`` builds it).
PY_FILES = PROJECT_ROOT / "build" / "stateops.zip"


def job_path(job: str) -> Path:
    """The file of Spark job ``job`` (``run_query.py``, ...) in the project's ``spark_jobs/``."""
    return PROJECT_ROOT / "spark_jobs" / job


def load_job(path: str | os.PathLike[str]) -> ModuleType:
    """The job file at ``path`` as a module (imported once per process). Job files import
    PySpark only inside ``main()``, so this costs no JVM."""
    path = Path(path)
    name = f"stateops_job_{path.stem}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise StateOpsError(f"{path}: not a Spark job of the project")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return module


def preflight_job(path: str | os.PathLike[str], argv: Sequence[str]) -> None:
    """Run the job's ``preflight`` on ``argv`` (its command-line arguments); raises the
    job's one-line :class:`StateOpsError` on bad input. A job without one passes."""
    job = load_job(path)
    if not hasattr(job, "preflight"):
        return
    try:
        args = job.parse_args([str(a) for a in argv])
    except SystemExit:  # argparse printed why; the arguments are the caller's bug
        raise StateOpsError(
            f"{Path(path).name}: arguments it does not take: {' '.join(map(str, argv))}"
        ) from None
    job.preflight(args)
