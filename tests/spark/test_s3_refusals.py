"""Refusals of Spark jobs on S3 in one line (issue 43): the S3 jars not fetched, a wrong
secret key, a bucket that does not exist, an endpoint that does not answer. Each is refused by
the CLI before a JVM starts (the ``no_jvm`` fixture records none), with exit code 2 and one
line that says what is wrong and what to do, never a key; the checkpoint's objects are
byte-for-byte what they were. The library's own commands refuse the same faults the same way.
Inside a running job, Spark's own S3A errors become one line too
(:func:`stateops.core.errors.as_domain_error`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from stateops.core.errors import as_domain_error
from stateops.dev.s3server import free_port
from stateops.spark.streaming import checkpoint_url
from tests.conftest import ROOT, S3_SECRET, run_cli, write_registry
from tests.spark.harness import digest, job_in_session, land, run_in_session

pytestmark = pytest.mark.spark
NAME = "page_visits"
WRONG_SECRET = "wrong-secret-never-printed"


@pytest.fixture(scope="module")
def written(spark, s3a, tmp_path_factory) -> tuple[Path, str]:
    """(registry, checkpoint URL) of page_visits after one run by Spark on the S3 endpoint."""
    root = tmp_path_factory.mktemp("refusals")
    url = s3a.url(f"{root.name}/{NAME}")
    with pytest.MonkeyPatch.context() as mp:
        s3a.set_env(mp)
        registry = write_registry(root, **{NAME: {"checkpoint": url}})
        land(root / "landing", round_=0, files=1)
        assert run_in_session(spark, registry, NAME)["status"] == "succeeded"
    return registry, url


def no_s3_jars(tmp_path: Path) -> dict[str, str]:
    """A project home where `make jars` fetched Spark's jars but not the S3 ones."""
    home = tmp_path / "home"
    (home / "build" / "jars" / "s3").mkdir(parents=True)
    (home / "build" / "jars" / "spark").symlink_to(ROOT / "build" / "jars" / "spark")
    for name in ("conf", "registry.yaml"):
        (home / name).symlink_to(ROOT / name)
    return {"STATEOPS_HOME": str(home)}


FAULTS = {
    "no-s3-jars": (no_s3_jars, ["make jars", "build/jars/s3"]),
    "wrong-secret": (
        lambda _: {"AWS_SECRET_ACCESS_KEY": WRONG_SECRET},
        ["SignatureDoesNotMatch", "check the secret key"],
    ),
    "endpoint-down": (
        lambda _: {"STATEOPS_S3_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"},
        ["does not answer", "check that it is up"],
    ),
}
# What each command is given: a registered query's name, or the checkpoint's URL.
COMMANDS = {
    "run": lambda url, out: ["run", NAME],
    "export": lambda url, out: ["export", url, "--out", str(out)],
    "verify --data": lambda url, out: ["verify", NAME, "--data"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_spark_job_on_s3_is_refused_in_one_line_before_a_jvm(
    s3a_env, written, no_jvm, fault, command, tmp_path
):
    registry, url = written
    before = digest(url)
    env, says = FAULTS[fault]
    out = tmp_path / "export"
    proc = run_cli("--registry", str(registry), *COMMANDS[command](url, out), env=env(tmp_path))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and all(s in lines[0] for s in says), lines[0]
    assert S3_SECRET not in proc.stderr + proc.stdout
    assert WRONG_SECRET not in proc.stderr + proc.stdout
    assert no_jvm() == []
    assert digest(url) == before and not out.exists()


def test_a_missing_bucket_is_refused_in_one_line(s3a_env, written, no_jvm, tmp_path):
    registry, _ = written
    url = "s3://no-such-bucket-43/checkpoints/page_visits"
    proc = run_cli("--registry", str(registry), "export", url, "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "NoSuchBucket" in proc.stderr and no_jvm() == []


@pytest.mark.parametrize("fault", ["no-s3-jars", "wrong-secret"])
def test_a_bootstrap_into_a_local_checkpoint_with_its_control_store_in_s3_is_refused_first(
    s3a_env, no_jvm, fault, tmp_path
):
    """Its checkpoint and initial state are local, but a bootstrap from a checkpoint exports
    it into its run's work folder in the control store, through Spark: refused before a JVM,
    not inside the job."""
    registry = write_registry(tmp_path)
    raw = yaml.safe_load(registry.read_text())
    registry.write_text(yaml.safe_dump({**raw, "control": s3a_env.url(f"{tmp_path.name}/c")}))
    land(tmp_path / "files", round_=0, files=1)
    env, says = FAULTS[fault]
    proc = run_cli(
        "--registry",
        str(registry),
        "bootstrap",
        NAME,
        "--initial-state",
        str(tmp_path / "files"),
        env=env(tmp_path),
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert all(s in lines[0] for s in says) and "/c" in lines[0], lines[0]
    assert no_jvm() == []


@pytest.mark.parametrize("fault", ["wrong-secret", "endpoint-down"])
def test_the_librarys_commands_refuse_the_same_faults_in_one_line(
    s3a_env, written, fault, tmp_path
):
    registry, url = written
    before = digest(url)
    env, says = FAULTS[fault]
    proc = run_cli("--registry", str(registry), "inspect", url, env=env(tmp_path))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert all(s in lines[0] for s in says[:1]), lines[0]
    assert WRONG_SECRET not in proc.stderr + proc.stdout
    assert digest(url) == before


# Spark's own S3A settings for a fault inside a running job: a file system of its own (S3A
# caches one per bucket and process) that tries once.
_ONCE = {
    "fs.s3a.impl.disable.cache": "true",
    "fs.s3a.attempts.maximum": "1",
    "fs.s3a.retry.limit": "0",
    "fs.s3a.connection.establish.timeout": "2s",
}
IN_JOB = {
    # S3A asks with HEAD first: a 403 without the error code a body would carry.
    "wrong-secret": ({"fs.s3a.secret.key": WRONG_SECRET}, "403); check the S3 connection's"),
    "missing-bucket": ({}, "create the bucket or fix the URL"),
    "endpoint-down": (
        {"fs.s3a.endpoint": "http://127.0.0.1:{port}"},
        "check that the endpoint is up",
    ),
}


@pytest.mark.parametrize("fault", list(IN_JOB))
def test_spark_s3a_faults_inside_a_job_become_one_line(spark, s3a_env, written, fault):
    _, url = written
    if fault == "missing-bucket":
        url = "s3://no-such-bucket-43/checkpoints/page_visits"
    conf, says = IN_JOB[fault]
    location = checkpoint_url(spark, url)
    changed = {**_ONCE, **{k: v.format(port=free_port()) for k, v in conf.items()}}
    for key, value in changed.items():
        spark.conf.set(key, value)
    try:
        with pytest.raises(Exception) as raised:
            spark.read.format("state-metadata").load(location).collect()
    finally:
        for key in changed:
            spark.conf.unset(key)
        checkpoint_url(spark, url)
    line = as_domain_error(raised.value)
    assert line is not None, str(raised.value)[:3000]
    assert says in str(line) and "\n" not in str(line), line
    assert WRONG_SECRET not in str(line) and S3_SECRET not in str(line)


def test_a_job_submitted_by_hand_refuses_a_wrong_secret_before_spark(
    spark, s3a_env, written, monkeypatch, capsys, tmp_path
):
    """A job's own main (as spark-submit runs it, without the CLI's preflight) asks the
    endpoint before it touches Spark: exit 2, one line, nothing written."""
    _, url = written
    before = digest(url)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", WRONG_SECRET)
    out = tmp_path / "export"
    code, stdout = job_in_session(spark, "export_state.py", "--checkpoint", url, "--out", str(out))
    said = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and stdout == "" and len(said) == 1, said
    assert "as Spark would: SignatureDoesNotMatch: check the secret key" in said[0]
    assert WRONG_SECRET not in said[0]
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET)
    assert digest(url) == before and not out.exists()
