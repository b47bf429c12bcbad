"""Spark's own guard on an S3 checkpoint (issue 55, item 4): the project's checkpoint file
manager (spark_jobs/java/stateops/, built by `make jars`) against Spark's abortable one,
which the project used before, side by side on SeaweedFS through S3A, called as Spark's
metadata logs call them (``createAtomic(file, overwriteIfPossible=False)``, write, close).

Two drivers writing one batch's offsets file: the second's close must fail with Hadoop's
FileAlreadyExistsException (what Spark turns into "concurrently using" the checkpoint), and
the first's bytes stand. An upload the store refuses must fail the write. The abortable
manager's close returns in both cases: its defect, shown so that the comparison cannot pass
by accident."""

from __future__ import annotations

import uuid

import pytest
from py4j.protocol import Py4JJavaError

from stateops.core.storage import location
from stateops.spark.streaming import CHECKPOINT_FILE_MANAGER, S3_FILE_MANAGER, checkpoint_url

pytestmark = pytest.mark.spark
ABORTABLE = "org.apache.spark.internal.io.cloud.AbortableStreamBasedCheckpointFileManager"


def _manager(spark, url: str, cls: str):
    """Spark's checkpoint file manager ``cls`` for the checkpoint at ``url`` (s3a://), made as
    Spark makes it: from the session's Hadoop configuration, which names the class."""
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    conf.set(CHECKPOINT_FILE_MANAGER, cls)
    jvm = spark._jvm
    root = jvm.org.apache.hadoop.fs.Path(url)
    manager = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
    made = manager.create(root, conf)
    assert made.getClass().getName() == cls
    return made, jvm.org.apache.hadoop.fs.Path(f"{url}/offsets/7")


def _closed(stream) -> str:
    """What ``stream.close()`` did: "returned", or the Java exception's class and message."""
    try:
        stream.close()
    except Py4JJavaError as err:
        java = err.java_exception
        return f"{java.getClass().getName()}: {java.getMessage()}"
    return "returned"


def _two_creates(spark, s3a_env, cls: str, first: bytes, second: bytes) -> tuple[str, str, str]:
    """Two creates of one batch's offsets file through manager ``cls``, both written before
    either closes: what each close did (:func:`_closed`), in order, and the file's text."""
    url = checkpoint_url(spark, s3a_env.url(f"guard-{uuid.uuid4().hex[:8]}"))
    manager, offsets = _manager(spark, url, cls)
    manager.mkdirs(offsets.getParent())
    streams = manager.createAtomic(offsets, False), manager.createAtomic(offsets, False)
    for stream, body in zip(streams, (first, second), strict=True):
        stream.write(bytearray(body))
    said = _closed(streams[0]), _closed(streams[1])
    return *said, location(url.replace("s3a://", "s3://") + "/offsets/7").read_text()


@pytest.mark.parametrize("cls", [S3_FILE_MANAGER, ABORTABLE])
def test_a_second_driver_s_write_of_a_log_file_fails_and_the_first_s_stands(spark, s3a_env, cls):
    first, said, stored = _two_creates(spark, s3a_env, cls, b"driver A", b"driver B")
    assert first == "returned"
    if cls == S3_FILE_MANAGER:
        assert said.startswith("org.apache.hadoop.fs.FileAlreadyExistsException: "), said
        assert "offsets/7 already exists (written by another driver)" in said
    else:
        assert said == "returned", "the abortable manager swallows it: driver B carries on"
    assert stored == "driver A"


@pytest.mark.parametrize("cls", [S3_FILE_MANAGER, ABORTABLE])
def test_a_failed_upload_fails_the_write(spark, s3a_env, cls):
    """An upload the store refuses at close (here: a key longer than S3's 1,024 bytes, which
    SeaweedFS refuses as S3 does) must fail the write, or the batch counts as committed."""
    url = checkpoint_url(spark, s3a_env.url(f"guard-{uuid.uuid4().hex[:8]}"))
    manager, _ = _manager(spark, url, cls)
    commits = spark._jvm.org.apache.hadoop.fs.Path(f"{url}/commits/{'7' * 1100}")
    manager.mkdirs(commits.getParent())
    stream = manager.createAtomic(commits, False)
    stream.write(bytearray(b"commit 7"))
    said = _closed(stream)
    if cls == S3_FILE_MANAGER:
        assert "KeyTooLong" in said or "too long" in said, said
    else:
        assert said == "returned", "the abortable manager swallows it: the batch counts"
    assert not location(url.replace("s3a://", "s3://") + "/commits").exists()


def test_a_log_file_whose_create_applied_and_whose_retry_was_refused_stands(spark, s3a_env):
    """The SDK retries a PUT whose answer was lost (a timeout, a 5xx); the retry of a create
    the store applied is refused (412) over the very bytes it wrote. The manager reads the file
    back: its own bytes, so the write stands (FLEET-SAFETY finding 16); other bytes are
    another driver's (above). Shown as the store sees it: the bytes are there when the
    create arrives."""
    plan = b"the plan of batch 7"
    applied, retried, stored = _two_creates(spark, s3a_env, S3_FILE_MANAGER, plan, plan)
    assert (applied, retried) == ("returned", "returned")
    assert stored == plan.decode()
