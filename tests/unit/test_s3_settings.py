"""S3 URLs, settings from an Airflow connection or the environment."""

from __future__ import annotations

import json

import pytest

from stateops.core.errors import StateOpsError
from stateops.core.s3 import names_a_url, parse_s3_url, s3_settings

pytestmark = pytest.mark.unit


def test_s3_urls():
    loc = parse_s3_url("s3://bucket/a/b/")
    assert (loc.bucket, loc.prefix, loc.key("objects", "x")) == ("bucket", "a/b", "a/b/objects/x")
    assert parse_s3_url("s3://bucket").key("manifests") == "manifests"
    for bad, why in [
        ("/local/path", "it does not begin with s3://"),
        ("s3:///nobucket", "no bucket after s3://"),
        ("http://x/y", "its scheme is http://, here it is s3://"),
        ("s3:/bucket/x", "its scheme is not written s3://"),
        ("s3//bucket/x", "its scheme is not written s3://"),
        ("S3://bucket/x", "its scheme is S3://, here it is s3://"),
        ("s3a://bucket/x", "its scheme is s3a://, here it is s3://"),
        ("s3://bucket/my backups", "it has a blank in it"),
    ]:
        with pytest.raises(StateOpsError) as refused:
            parse_s3_url(bad)
        assert str(refused.value) == f"{bad}: not an S3 URL ({why}); use s3://BUCKET/PREFIX"


def test_an_argument_with_a_colon_or_a_slash_is_a_url_not_a_query_name():
    assert not names_a_url("page_visits")
    assert all(names_a_url(u) for u in ("s3:/b/x", "s3//b", "S3://b", "bucket/prefix"))


def test_settings_from_an_airflow_connection_never_show_the_secret(monkeypatch):
    extra = {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"}
    conn = {"conn_type": "aws", "login": "AK", "password": "s3cr3t", "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_BACKUP_S3", json.dumps(conn))
    settings = s3_settings("backup_s3")
    assert (settings.endpoint_url, settings.region, settings.access_key, settings.secret_key) == (
        "http://127.0.0.1:9000",
        "eu-west-1",
        "AK",
        "s3cr3t",
    )
    assert "s3cr3t" not in repr(settings) and "s3cr3t" not in str(settings)
    with pytest.raises(StateOpsError, match="AIRFLOW_CONN_MISSING is not set"):
        s3_settings("missing")


def test_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("STATEOPS_S3_ENDPOINT_URL", "http://127.0.0.1:9100")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AK")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t")
    settings = s3_settings()
    assert (settings.endpoint_url, settings.access_key) == ("http://127.0.0.1:9100", "AK")


def test_a_connection_with_a_session_token_and_an_addressing_style_reaches_spark_and_boto3(
    monkeypatch,
):
    from stateops.core.s3 import as_connection, s3_client, spark_s3_conf

    extra = {
        "region_name": "eu-central-1",
        "aws_session_token": "t0ken",
        "config_kwargs": {"s3": {"addressing_style": "virtual"}},
    }
    conn = {"conn_type": "aws", "login": "ASIA1", "password": "s3cr3t", "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_ROLE_S3", json.dumps(conn))
    settings = s3_settings("role_s3")
    assert (settings.session_token, settings.addressing_style, settings.path_style) == (
        "t0ken",
        "virtual",
        False,
    )
    conf = spark_s3_conf(settings)
    assert conf["spark.hadoop.fs.s3a.aws.credentials.provider"].endswith(
        "TemporaryAWSCredentialsProvider"
    )
    assert conf["spark.hadoop.fs.s3a.session.token"] == "t0ken"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-central-1"
    assert "spark.hadoop.fs.s3a.endpoint" not in conf  # AWS itself
    assert conf.get("spark.hadoop.fs.s3a.path.style.access") == "false"
    client = s3_client(settings)
    assert client.meta.config.s3["addressing_style"] == "virtual"
    assert client.meta.region_name == "eu-central-1"
    monkeypatch.setenv("AIRFLOW_CONN_AGAIN", as_connection(settings))
    assert s3_settings("again") == settings  # what a task hands its Spark jobs reads back


def test_an_endpoint_is_path_style_in_us_east_1_unless_told_and_aws_leaves_both_to_the_sdk(
    monkeypatch,
):
    from stateops.core.s3 import connection_settings, spark_s3_conf

    for name in (
        "AWS_DEFAULT_REGION",
        "AWS_REGION",
        "STATEOPS_S3_ENDPOINT_URL",
        "AWS_ENDPOINT_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    server = connection_settings("AK", "s", {"endpoint_url": "http://127.0.0.1:9000"})
    assert (server.region, server.path_style) == ("us-east-1", True)
    assert spark_s3_conf(server)["spark.hadoop.fs.s3a.path.style.access"] == "true"
    aws = connection_settings(None, None, {})
    assert (aws.region, aws.path_style, aws.access_key) == (None, False, None)
    conf = spark_s3_conf(aws)
    assert not any(k.endswith(("region", "path.style.access", "provider")) for k in conf)
    assert s3_settings().region is None
    with pytest.raises(StateOpsError, match="S3 addressing style 'vhost': expected one of"):
        connection_settings(None, None, {"config_kwargs": {"s3": {"addressing_style": "vhost"}}})
