"""Domain exceptions: each message says what is wrong and what to do.

:func:`domain_errors` is the one boundary where operating-system and library errors that bad
input causes (a path that loops, a name too long, a read-only checkpoint, an endpoint that is
not a URL) become a :class:`StateOpsError` of one line. The CLI, the Spark jobs and the Airflow
tasks run their work inside it; anything it does not recognise is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "CheckpointError",
    "LeaseLostError",
    "LockHeldError",
    "NotACheckpointError",
    "OperationFailed",
    "PathError",
    "RegistryError",
    "StateOpsError",
    "Unreachable",
    "as_domain_error",
    "domain_errors",
    "one_line",
    "query_error_line",
    "s3_error",
    "spark_s3_error",
]


class StateOpsError(Exception):
    """Base of every error a user can meet; the CLI prints its message on one line."""


class OperationFailed(StateOpsError):
    """The input was good and the operation failed after its plan held (a Spark job, a proof);
    the message says what was undone and how to go on. The CLI exits 1, as for a failed Spark
    job (2 is for refusals: bad input, nothing changed)."""


class Unreachable(StateOpsError):
    """A source's or sink's servers did not answer (a Kafka broker, ...): what was asked of
    them is unknown, not refused."""


class CheckpointError(StateOpsError):
    """A path is not a readable Spark checkpoint, or one of its files is corrupt."""


class NotACheckpointError(CheckpointError):
    """The path does not exist or holds no Spark checkpoint at all (as opposed to a damaged one)."""


class RegistryError(StateOpsError):
    """The managed-query registry is missing, malformed or names an unknown query."""


class LockHeldError(StateOpsError):
    """Another lifecycle operation holds the query's lock."""


class LeaseLostError(LockHeldError, OperationFailed):
    """A holder lost the query's lease while it worked (it stalled past its lease, its renewals
    failed, or the lease was taken over or released): it stopped before its next write. Not a
    refusal (it may have changed things already: the message says what is left to do), and an
    Airflow task that meets it is retried (the retry waits for the lease)."""


class PathError(StateOpsError):
    """A path cannot be used as given: it loops, is too long, is a file, or may not be read or
    written by this user."""


# errno -> (what is wrong, what to do). Only conditions that the user's paths or permissions
# cause; anything else keeps the operating system's own words.
_OS_FAULTS: dict[int, tuple[str, str]] = {
    errno.ELOOP: (
        "a symbolic link loop (the link points back to itself)",
        "give the real folder, or point the link at it",
    ),
    errno.ENAMETOOLONG: ("a name longer than the file system allows", "use a shorter path"),
    errno.ENOTDIR: (
        "not a folder (it, or a folder on its way, is a regular file)",
        "give a folder, or move the file out of the way",
    ),
    errno.EISDIR: ("a folder where a file is expected", "give a file"),
    errno.EACCES: (
        "permission denied",
        "run as a user who may read and write it, or change its permissions",
    ),
    errno.EPERM: (
        "operation not permitted (immutable or append-only?)",
        "check its attributes (lsattr) and owner, or run as a user who may change it",
    ),
    errno.EROFS: (
        "on a read-only file system",
        "remount it read-write, or work on a copy on a writable file system",
    ),
    errno.ENOENT: ("no such file or folder", "check the path"),
    errno.EEXIST: ("already exists", "remove it, or choose another path"),
    errno.ENOTEMPTY: ("not empty", "choose a new or empty folder"),
    errno.ENOSPC: ("no space left on the device", "free space, then run again"),
    errno.EDQUOT: ("disk quota exceeded", "free space, then run again"),
    errno.EXDEV: (
        "on another file system than its destination",
        "keep the paths on one file system",
    ),
    errno.EIO: ("an input/output error", "check the disk and its log (dmesg)"),
}


@contextmanager
def about(field: str) -> Iterator[None]:
    """Checks of one trigger-form field (or CLI option): a refusal raised inside names
    ``field`` first, as the forms and the REST API show it (``input_before: ...``)."""
    try:
        yield
    except StateOpsError as err:
        if _NAMED.match(str(err)) or str(err).startswith(f"{field} "):
            raise  # it names its field already
        raise StateOpsError(f"{field}: {one_line(err)}") from None


_NAMED = re.compile(r"^[a-z]+_[a-z_]+(, [a-z]+_[a-z_]+)*: ")  # to_batch: ..., new_source_path: ...


def one_line(message: object) -> str:
    """``message`` on one line: a message built from another library's text may hold breaks."""
    return " ".join(str(message).split())


_PYTHON_ERROR = re.compile(r"^\s*(?:[\w.]+\.)?(\w*(?:Error|Exception|Exit)): (.*\S)\s*$")
# Wrappers Spark and Py4J put around the error that happened: never the one to name.
_WRAPPERS = {"PythonException", "Py4JJavaError", "StreamingQueryException", "SparkException"}


# Spark's refusals, on restart, of a checkpoint's state for the query's code.
_STATE_OF_OTHER_CODE = re.compile(
    r"\[(STATE_STORE_(KEY|VALUE)_SCHEMA_NOT_COMPATIBLE|STATE_STORE_COLUMN_FAMILY_SCHEMA_"
    r"INCOMPATIBLE|STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION|STREAMING_STATEFUL_OPERATOR_"
    r"NOT_MATCH_IN_STATE_METADATA)\]"
)
# The lines of those refusals that say nothing about this state (and one that advises
# running without the check: never).
_SPARK_BOILERPLATE = ("Please check", "If you want to force", "However, please note")
STATE_OF_OTHER_CODE = (
    "the checkpoint's state was written by other code than the query's (its code changed, or "
    "the checkpoint was carried over from another query): deploy the code that wrote it, or "
    "run the query on a new checkpoint; for a processor, stateops upgrade QUERY --dry-run "
    "says how to carry the state over"
)

# Spark's refusal of a value that does not parse (a Kafka source's JSON values, by default).
MALFORMED = (
    "a record did not parse as its source's schema (Spark's MALFORMED_RECORD_IN_PARSING: for "
    "a Kafka source, a value that is not JSON of the schema or Avro of avro_schema, empty or "
    "null), and the run "
    "stopped before committing its batch: fix the producer; a Kafka source can instead skip "
    "and count such records (malformed: count) or read them as they are (encoding: raw)"
)
# How Spark says it: its error class (JSON), and from_avro's FAILFAST, which has none.
_MALFORMED_SIGNS = ("[MALFORMED_RECORD_IN_PARSING", "Malformed records are detected in record")


def query_error_line(error: object) -> str:
    """A failed query's error in one line: Spark's first line, and where the failure was in
    Python code (Spark passes on its traceback), the Python exception that ended it; an S3
    fault of Spark's S3A connector as :func:`spark_s3_error` says it; Spark's refusal of the
    checkpoint's state for the query's code with the state's and the code's schemas or
    operators, and what to do."""
    s3 = spark_s3_error(str(error))
    if s3 is not None:
        return str(s3)
    # the error itself, not the query's plan Spark appends (a Kafka source's own refusal of a
    # null value is a literal in it: any failure of the query would read as malformed)
    said = str(error).split("\n=== Streaming Query ===", 1)[0]
    if any(sign in said for sign in _MALFORMED_SIGNS):
        return MALFORMED
    other_code = _STATE_OF_OTHER_CODE.search(str(error))
    if other_code is not None:
        said = str(error)[other_code.start() :].split("\n\n", 1)[0].split("\n=== ", 1)[0]
        kept = [line for line in said.splitlines() if not line.startswith(_SPARK_BOILERPLATE)]
        spark = re.sub(r"\s*SQLSTATE: \w+\s*$", "", one_line(" ".join(kept)))
        return f"{spark.rstrip('.')}: {STATE_OF_OTHER_CODE}"
    lines = str(error).splitlines()
    first = lines[0].strip() if lines else ""
    if "Traceback (most recent call last)" not in str(error):
        return first
    raised = [
        f"{m.group(1)}: {m.group(2)}"
        for line in lines
        if (m := _PYTHON_ERROR.match(line)) and m.group(1) not in _WRAPPERS
    ]
    if not raised:
        return first
    summary = first.split(" Reason: ", 1)[0].split(" Return Message:", 1)[0].rstrip(".")
    return f"{summary}: {raised[-1]}"


def _os_error(err: OSError) -> PathError:
    what, todo = _OS_FAULTS.get(err.errno or 0, (None, None))
    what = what or (err.strerror or type(err).__name__).lower()
    if todo is None:
        reachable = isinstance(err, ConnectionError | TimeoutError)
        todo = "check that the service is up and reachable" if reachable else "check the path"
    where = err.filename
    if err.filename2 is not None:
        where = f"{err.filename} -> {err.filename2}"
    text = f"{os.fsdecode(where)}: {what}" if where is not None else what
    return PathError(f"{text}; {todo}")


_THROTTLED = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequests",
    "ServiceUnavailable",
    "RequestThrottled",
}
_AGAIN = "run again: an operation goes on from where it stopped"


def _status(err: Any) -> int | None:
    return err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def s3_error(err: Exception, what: str) -> StateOpsError:
    """One line naming the operation and the S3 error code; never credentials."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectionClosedError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
    )

    if isinstance(err, ClientError):
        error = err.response.get("Error", {})
        code = error.get("Code", "?")
        hint = {
            "InvalidAccessKeyId": "check the access key of the S3 connection",
            "SignatureDoesNotMatch": "check the secret key of the S3 connection",
            "AccessDenied": "check the S3 connection's credentials and permissions",
            "NoSuchBucket": "create the bucket or fix the URL",
            "NoSuchKey": "no such object; list the backups with `stateops backups list`",
        }.get(code)
        if hint is None and (code in _THROTTLED or _status(err) in (429, 503)):
            hint = "the endpoint is throttling requests (retried with backoff); " + _AGAIN
        return StateOpsError(f"S3 {what}: {code}: {hint or 'see the S3 server log'}")
    if isinstance(err, EndpointConnectionError | ConnectionClosedError | ConnectTimeoutError):
        return StateOpsError(
            f"S3 {what}: the endpoint does not answer ({type(err).__name__}); check that it is "
            f"up and that the endpoint URL is right, then {_AGAIN}"
        )
    if isinstance(err, NoCredentialsError):
        return StateOpsError(
            f"S3 {what}: no credentials; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(or the connection's login and password)"
        )
    if isinstance(err, BotoCoreError):
        return StateOpsError(f"S3 {what}: {type(err).__name__}: {err}; {_AGAIN}")
    return StateOpsError(f"S3 {what}: {type(err).__name__}")


# What Spark says when hadoop-aws (or the abortable checkpoint file manager) is not on its
# class path: Hadoop's FileSystem, its FileContext, Spark's checkpoint file manager.
_NO_S3_CONNECTOR = re.compile(
    r"org\.apache\.hadoop\.fs\.s3a\.\w+ not found"
    r"|ClassNotFoundException: org\.apache\.spark\.internal\.io\.cloud\."
)


# Spark's S3A connector's faults (hadoop-aws 3.5 on the AWS SDK v2), as its exceptions say
# them: (pattern, what is wrong, what to do), the first that matches. Its texts name the
# s3a:// path, the request and the S3 error code; never a key.
_S3A_FAULTS = [
    (
        r"UnknownStoreException|NoSuchBucket|Bucket \S+ does not exist",
        "the bucket does not exist",
        "create the bucket or fix the URL",
    ),
    (
        r"SignatureDoesNotMatch",
        "the endpoint refused the request's signature (SignatureDoesNotMatch)",
        "check the secret key of the S3 connection",
    ),
    (
        r"InvalidAccessKeyId",
        "the endpoint does not know the access key (InvalidAccessKeyId)",
        "check the access key of the S3 connection",
    ),
    (
        r"AccessDeniedException|AccessDenied|Status Code: 403|403 Forbidden",
        "access denied (403)",
        "check the S3 connection's credentials and permissions",
    ),
    (
        r"UnknownHostException|Connection refused|ConnectException|ConnectTimeoutException"
        r"|Unable to execute HTTP request|Unable to load credentials|NoAuthWithAWSException",
        "the endpoint does not answer, or no credentials reached it",
        "check that the endpoint is up and its URL right (STATEOPS_S3_ENDPOINT_URL or the "
        "connection), and that the keys are set; then run again",
    ),
]
_S3A_CLASSES = re.compile(r"org\.apache\.hadoop\.fs\.s3a\.|software\.amazon\.awssdk|S3Exception")
_S3A_PATH = re.compile(r"s3a://[^\s:;,'\"]+")


def spark_s3_error(text: str) -> StateOpsError | None:
    """One line for a fault of Spark's S3A connector in ``text`` (a Spark or Py4J error's),
    naming the first s3a:// path it names; None when ``text`` is no S3A fault."""
    path = _S3A_PATH.search(text)
    if path is None or not _S3A_CLASSES.search(text):
        return None  # not S3A's: e.g. a query with an S3 sink whose own code failed
    for pattern, what, todo in _S3A_FAULTS:
        if re.search(pattern, text):
            return StateOpsError(f"Spark on S3: {path.group(0).rstrip('/.')}: {what}; {todo}")
    return None


def as_domain_error(err: BaseException) -> StateOpsError | None:
    """The one-line domain error for ``err``, or None when bad input cannot explain it (a bug:
    its traceback is wanted)."""
    if isinstance(err, StateOpsError):
        return err
    if isinstance(err, OSError):
        return _os_error(err)
    # pathlib before Python 3.13 reports a symlink loop in resolve() as a RuntimeError.
    if isinstance(err, RuntimeError) and str(err).startswith("Symlink loop from "):
        looped = str(err).removeprefix("Symlink loop from ").strip("'\"")
        return _os_error(OSError(errno.ELOOP, os.strerror(errno.ELOOP), looped))
    if type(err).__name__ == "Py4JJavaError" and _NO_S3_CONNECTOR.search(str(err)):
        return StateOpsError(
            "Spark has no S3 connector for an s3a:// location (hadoop-aws is not on its class "
            "path): run `make jars` (it fetches build/jars/s3 with mvn), or on a cluster add "
            "the jars of maven/s3/pom.xml to each node (docs/checkpoints-on-s3.md)"
        )
    spark = type(err).__name__ in _WRAPPERS or type(err).__module__.startswith(
        ("pyspark.", "py4j.")
    )
    if spark and (s3 := spark_s3_error(str(err))) is not None:
        return s3
    botocore = sys.modules.get("botocore.exceptions")  # only if S3 was used: no import here
    if botocore is not None and isinstance(err, botocore.ClientError | botocore.BotoCoreError):
        return s3_error(err, "request")
    return None


@contextmanager
def domain_errors() -> Iterator[None]:
    """Run a command's or task's work; OS and library errors that bad input causes leave it as
    a one-line :class:`StateOpsError` (the original is its ``__cause__``)."""
    try:
        yield
    except StateOpsError:
        raise
    except Exception as err:
        domain = as_domain_error(err)
        if domain is None:
            raise
        raise domain from err
