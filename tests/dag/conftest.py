"""Airflow reads AIRFLOW_HOME on first import: point it at a throwaway folder first."""

from __future__ import annotations

import os
import sys
import tempfile

from tests.conftest import ROOT

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="stateops-airflow-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
# Airflow puts plugins/ on sys.path when it runs; DagBag loaded in-process needs it too.
sys.path.insert(0, str(ROOT / "plugins"))
