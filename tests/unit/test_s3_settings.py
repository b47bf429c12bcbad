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
