"""What a Spark job of an installed package takes from the package itself (issue 75 item 1):
the library the executors import (``--py-files``), zipped from the package where no checkout
built one, and the project's jar (the S3 checkpoint file manager) on the class path."""

from __future__ import annotations

import zipfile

import pytest

import stateops.spark.jobs as jobs

pytestmark = pytest.mark.unit


def test_without_a_checkout_s_zip_the_executors_get_the_installed_package(tmp_path, monkeypatch):
    monkeypatch.setattr(jobs, "PY_FILES", tmp_path / "not-built.zip")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    jobs._package_zip.cache_clear()
    try:
        made = jobs.py_files()
        assert made.startswith(str(tmp_path / "cache" / "stateops"))
        with zipfile.ZipFile(made) as shipped:
            names = set(shipped.namelist())
            assert (
                shipped.read("stateops/__init__.py")
                == (jobs.Path(jobs.__file__).parents[1] / "__init__.py").read_bytes()
            )
        assert {"stateops/spark/jobs.py", "stateops/jobs/run_query.py"} <= names
        assert not any("__pycache__" in n for n in names)
    finally:
        jobs._package_zip.cache_clear()
    built = tmp_path / "built.zip"
    built.write_bytes(b"")
    monkeypatch.setattr(jobs, "PY_FILES", built)
    assert jobs.py_files() == str(built)  # a checkout's, as make built it


def test_a_packaged_jar_is_on_the_class_path_without_the_fetched_connector(tmp_path, monkeypatch):
    empty = tmp_path / "jars" / "s3"
    empty.mkdir(parents=True)
    monkeypatch.setattr(jobs, "S3_JARS", empty)
    monkeypatch.setattr(jobs, "CHECKPOINT_JAR", tmp_path / "pkg" / "stateops-checkpoint.jar")
    assert jobs.spark_classpath_conf() == {}
    with pytest.raises(jobs.StateOpsError, match="Spark's S3 connector .* run `make jars`"):
        jobs.require_s3_jars(["s3a://b/cp"], "run_query.py")
    jobs.CHECKPOINT_JAR.parent.mkdir()
    jobs.CHECKPOINT_JAR.write_bytes(b"PK")
    jar = str(jobs.CHECKPOINT_JAR)
    assert jobs.spark_classpath_conf() == {
        "spark.driver.extraClassPath": jar,
        "spark.executor.extraClassPath": jar,
    }
    jobs.require_s3_jars(["s3a://b/cp"], "run_query.py")  # the cluster brings the connector
    (empty / "hadoop-aws.jar").write_bytes(b"PK")
    assert jobs.spark_classpath_conf()["spark.driver.extraClassPath"] == f"{empty}/*:{jar}"
