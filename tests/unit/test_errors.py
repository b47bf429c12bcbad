"""The error boundary on real operating-system errors, the registry's YAML errors and the S3
endpoint check: one line naming the path or file and what to do; a bug keeps its traceback."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from stateops.core.errors import PathError, RegistryError, StateOpsError, domain_errors
from stateops.core.registry import load_registry
from stateops.core.s3 import S3Settings, s3_client

pytestmark = pytest.mark.unit


def _raised_by(action) -> BaseException:
    try:
        action()
    except BaseException as err:  # noqa: BLE001 -- the test inspects whatever it was
        return err
    raise AssertionError("no error")


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        ("loop", "a symbolic link loop"),
        ("too long", "a name longer than the file system allows; use a shorter path"),
        ("below a file", "not a folder"),
        ("a folder opened as a file", "a folder where a file is expected"),
        ("missing", "no such file or folder"),
        ("resolve loop", "a symbolic link loop"),  # pathlib < 3.13: a RuntimeError
    ],
)
def test_os_faults_become_one_line_naming_the_path(tmp_path, fault, says):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "file").write_text("x")
    path = {
        "loop": tmp_path / "loop" / "x",
        "too long": tmp_path / ("n" * 300),
        "below a file": tmp_path / "file" / "x",
        "a folder opened as a file": tmp_path,
        "missing": tmp_path / "missing",
        "resolve loop": tmp_path / "loop",
    }[fault]
    action = (lambda: path.resolve()) if fault == "resolve loop" else (lambda: path.read_text())
    original = _raised_by(action)
    with pytest.raises(PathError) as refused, domain_errors():
        action()
    message = str(refused.value)
    assert message.startswith(str(path)), message
    assert says in message and "\n" not in message and "; " in message
    assert type(refused.value.__cause__) is type(original)  # kept for a debugger


def test_a_read_only_file_system_and_a_permission_fault_say_what_to_do(tmp_path):
    for code, says in [(errno.EROFS, "read-only file system"), (errno.EACCES, "permission")]:
        with pytest.raises(PathError, match=says) as refused, domain_errors():
            raise OSError(code, os.strerror(code), str(tmp_path / "ckpt" / "commits" / "3"))
        assert str(tmp_path / "ckpt" / "commits" / "3") in str(refused.value)


def test_a_bug_keeps_its_traceback_and_domain_errors_pass_unchanged():
    with pytest.raises(KeyError), domain_errors():
        {}["missing"]
    with pytest.raises(TypeError), domain_errors():
        Path(7)  # type: ignore[arg-type]
    original = StateOpsError("x: refused; do y")
    with pytest.raises(StateOpsError) as refused, domain_errors():
        raise original
    assert refused.value is original


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("queries:\n  a:\n    source: [1, 2\n    x: y\n", 4, "expected ',' or ']'"),
        ("queries:\n  a: {b: 1\n", 3, "expected ',' or '}'"),
        ("queries:\n\tfoo: 1\n", 2, "found character '\\t' that cannot start any token"),
        ('queries:\n  a: "x\n', 3, "found unexpected end of stream"),
        ("a: b: c\n", 1, "mapping values are not allowed here"),
        ("q: &x 1\nr: *y\n", 2, "found undefined alias 'y'"),
    ],
)
def test_a_malformed_registry_is_one_line_with_file_line_and_what_to_do(
    tmp_path, text, line, problem
):
    path = tmp_path / "registry.yaml"
    path.write_text(text)
    with pytest.raises(RegistryError) as refused:
        load_registry(path)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{path}:{line}:")
    assert problem in message and message.endswith(f"fix line {line} of the registry")
    assert "<unicode string>" not in message and "^" not in message


@pytest.mark.parametrize(
    "endpoint", ["not a url", "localhost:9000", "http://", "http://[::1", "ftp://h", "http://h:x"]
)
def test_an_endpoint_that_is_not_a_url_is_refused_naming_the_setting(endpoint):
    with pytest.raises(StateOpsError, match="is not a URL; set STATEOPS_S3_ENDPOINT_URL"):
        s3_client(S3Settings(endpoint, "us-east-1", "key", "secret"))


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        (None, "https://s3.eu-west-1.amazonaws.com"),
        ("http://127.0.0.1:9000", "http://127.0.0.1:9000"),
        ("https://s3.example.com", "https://s3.example.com"),
    ],
)
def test_a_real_endpoint_or_none_makes_a_client_for_it(endpoint, url):
    """None: AWS itself, in the settings' region, addressed as the SDK chooses (virtual-hosted);
    else the endpoint as given, path-style (a local endpoint has no bucket subdomains), with
    the settings' region and keys."""
    client = s3_client(S3Settings(endpoint, "eu-west-1", "key", "secret"))
    assert (client.meta.endpoint_url, client.meta.region_name) == (url, "eu-west-1")
    style = "path" if endpoint else "auto"
    assert client.meta.config.s3 == {"addressing_style": style}
    credentials = client._request_signer._credentials
    assert (credentials.access_key, credentials.secret_key) == ("key", "secret")


def test_a_query_that_failed_in_python_code_names_the_python_exception():
    from stateops.core.errors import MALFORMED, query_error_line

    spark_said = (
        "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in "
        "foreach batch sink. Reason: An exception was raised by the Python Proxy. Return "
        "Message: Traceback (most recent call last):\n"
        '  File "/x/pyspark/errors/exceptions/captured.py", line 257, in deco\n'
        "    raise converted from None\n"
        "pyspark.errors.exceptions.captured.PythonException: An exception was thrown from the "
        "Python worker:\n"
        "    raise ValueError(f'no visit for {user}')\n"
        "ValueError: no visit for u00007\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(X.scala:1)\n"
    )
    assert query_error_line(spark_said) == (
        "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in "
        "foreach batch sink: ValueError: no visit for u00007"
    )
    # the plan Spark appends holds a Kafka source's own refusal of a null value, a literal: the
    # failure is still the one it is, not a malformed record
    planned = f"{spark_said}\n=== Streaming Query ===\nraise_error([MALFORMED_RECORD_IN_PARSING] x)"
    assert query_error_line(planned) == query_error_line(spark_said)
    plain = "[STREAM_FAILED] Query terminated\nwith more lines"
    assert query_error_line(plain) == "[STREAM_FAILED] Query terminated"
    # from_avro's FAILFAST says it without an error class (Spark 4.2's AvroDataToCatalyst)
    avro = (
        "[STREAM_FAILED] Query [id = 1] terminated with exception: Job aborted\nCaused by: "
        "org.apache.spark.SparkException: Malformed records are detected in record parsing. "
        "Current parse Mode: FAILFAST. To process malformed records as null result, try "
        "setting the option 'mode' as 'PERMISSIVE'."
    )
    assert query_error_line(avro) == MALFORMED


def test_spark_s_refusal_of_the_state_for_the_code_names_both_schemas_and_what_to_do():
    """As Spark 4.2 said it for a transform whose aggregation gained a column (run by hand);
    its advice to switch the schema check off is not passed on."""
    from stateops.core.errors import STATE_OF_OTHER_CODE, query_error_line

    spark_said = (
        "[STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE] Provided value schema does not match "
        "existing state value schema.\nPlease check number and type of fields.\nExisting "
        "value_schema=StructType(StructField(count,LongType,false)) and new value_schema="
        "StructType(StructField(count,LongType,false),StructField(max,StringType,true)).\nIf "
        "you want to force running the query without schema validation, please set "
        "spark.sql.streaming.stateStore.stateSchemaCheck to false.\nHowever, please note that "
        "running the query with incompatible schema could cause non-deterministic behavior. "
        "SQLSTATE: XXKST\n=== Streaming Query ===\nIdentifier: uc\n"
    )
    assert query_error_line(spark_said) == (
        "[STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE] Provided value schema does not match "
        "existing state value schema. Existing value_schema=StructType(StructField(count,"
        "LongType,false)) and new value_schema=StructType(StructField(count,LongType,false),"
        f"StructField(max,StringType,true)): {STATE_OF_OTHER_CODE}"
    )


# Spark's S3A faults as Spark 4.2 with hadoop-aws 3.5.0 said them against SeaweedFS (the first
# line of each Py4JJavaError; tests/spark/test_s3_refusals.py raises them for real).
_S3A_SAID = {
    "wrong secret": (
        "java.nio.file.AccessDeniedException: s3a://spark-checkpoints/q/commits: getFileStatus "
        "on s3a://spark-checkpoints/q/commits: software.amazon.awssdk.services.s3.model."
        "S3Exception: Forbidden (Service: S3, Status Code: 403, Request ID: 18EB):null",
        "s3a://spark-checkpoints/q/commits: access denied (403); check the S3 connection's",
    ),
    "missing bucket": (
        "org.apache.hadoop.fs.s3a.UnknownStoreException: `s3a://no-such-bucket-43/q/commits': "
        "getFileStatus on s3a://no-such-bucket-43/q/commits: software.amazon.awssdk.services."
        "s3.model.NoSuchBucketException: The specified bucket does not exist (Service: S3, "
        "Status Code: 404, Request ID: 18EB) (SDK Attempt Count: 1):NoSuchBucket",
        "s3a://no-such-bucket-43/q/commits: the bucket does not exist; create the bucket",
    ),
    "endpoint down": (
        "java.net.ConnectException: getFileStatus on s3a://spark-checkpoints/q/commits: "
        "software.amazon.awssdk.core.exception.SdkClientException: Unable to execute HTTP "
        "request: Connect to 127.0.0.1:57263 [/127.0.0.1] failed: Connection refused",
        "the endpoint does not answer",
    ),
    "signature in a body": (
        "java.nio.file.AccessDeniedException: s3a://b/q/offsets/3: PUT 0-byte object on "
        "s3a://b/q/offsets/3: S3Exception: The request signature we calculated does not match "
        "(Service: S3, Status Code: 403):SignatureDoesNotMatch",
        "s3a://b/q/offsets/3: the endpoint refused the request's signature",
    ),
}


@pytest.mark.parametrize("fault", list(_S3A_SAID))
def test_spark_s3a_faults_become_one_line_naming_the_path(fault):
    from stateops.core.errors import query_error_line, spark_s3_error

    said, says = _S3A_SAID[fault]
    line = spark_s3_error(f"An error occurred while calling o110.collectToPython.\n: {said}\n")
    assert line is not None and says in str(line) and "\n" not in str(line), line
    assert str(line).startswith("Spark on S3: s3a://")
    assert query_error_line(f"[STREAM_FAILED] Query terminated with exception: {said}") == str(line)


def test_an_error_that_names_no_s3a_path_is_no_s3_fault():
    from stateops.core.errors import spark_s3_error

    assert spark_s3_error("java.net.ConnectException: Connection refused (kafka:9092)") is None
    assert spark_s3_error("java.io.FileNotFoundException: s3a://b/q/offsets/9") is None
    # a query with its sink in S3 whose own code could not reach its database: not S3's fault
    udf = "PythonException: sink s3a://b/out: psycopg.OperationalError: Connection refused"
    assert spark_s3_error(udf) is None
