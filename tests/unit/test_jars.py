"""The Maven artifacts, the project's way: make jars fetched them once (a second run fetches
nothing), and a machine without mvn is told so in one line."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit


def test_a_second_fetch_downloads_nothing_and_keeps_the_jars():
    """`make test` ran `make jars` before this test: the stamps say each set is complete."""
    jars = ROOT / "build" / "jars"
    before = {p: p.stat().st_mtime_ns for p in jars.rglob("*")}
    proc = subprocess.run(
        ["scripts/fetch_jars.sh", "spark", "broker", "s3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PY": str(ROOT / ".venv" / "bin" / "python")},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == "", "a second run fetched again"
    assert {p: p.stat().st_mtime_ns for p in jars.rglob("*")} == before
    # the broker's jars stay in their own folder: none of them is handed to Spark
    spark = {p.name for p in (jars / "spark").glob("*.jar")}
    assert not spark & {p.name for p in (jars / "broker").glob("*.jar")}


def test_the_s3_jars_match_pysparks_hadoop_and_bring_no_other_cloud():
    """hadoop-aws at the Hadoop version PySpark ships, the AWS SDK bundle it names, and from
    Spark's cloud module its own jar only (its POM would bring Azure's and Google's)."""
    import pyspark

    shipped = {p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    hadoop = next(n for n in shipped if n.startswith("hadoop-client-api-"))[18:-4]
    s3 = {p.name for p in (ROOT / "build" / "jars" / "s3").glob("*.jar")}
    assert f"hadoop-aws-{hadoop}.jar" in s3
    assert any(n.startswith("bundle-2.") for n in s3)
    assert [n for n in s3 if n.startswith("spark-")] == [
        next(n for n in s3 if n.startswith("spark-hadoop-cloud_2.13-"))
    ]
    assert not any("azure" in n or "gcs" in n or "hadoop-common" in n for n in s3)
    assert not s3 & shipped, "a jar PySpark ships, twice on the class path"


def test_the_prerequisites_name_a_missing_mvn_in_one_line(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("python3", "java", "javac", "sed", "head", "bash", "env"):
        found = shutil.which(tool)
        assert found, tool
        (bin_ / tool).symlink_to(Path(found).resolve())
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "check_prereqs.sh")],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_)},
    )
    assert proc.returncode == 1
    missing = [line for line in proc.stdout.splitlines() if line.startswith("missing:")]
    assert missing == [
        "missing: mvn (Maven fetches Spark's Kafka connector and the Kafka broker): "
        "apt-get install maven"
    ], proc.stdout
    (bin_ / "javac").unlink()  # a JRE only: the S3 checkpoint file manager cannot be built
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "check_prereqs.sh")],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_)},
    )
    assert (
        "missing: javac (a JDK 17 compiles the project's S3 checkpoint file manager): "
        "apt-get install openjdk-17-jdk-headless"
    ) in proc.stdout.splitlines(), proc.stdout
