"""S3 settings, client and errors: one place that knows credentials, and never prints them.

Settings come from an Airflow connection of type ``aws`` or from the environment
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``STATEOPS_S3_ENDPOINT_URL``, ``AWS_DEFAULT_REGION``). Inside an Airflow task the connection is
resolved by Airflow's own AWS hook (a secrets backend, role assumption, web identity, the
instance's role: ``stateops_airflow.connections``), and the settings it resolved are handed to
this process and the Spark jobs it starts as ``AIRFLOW_CONN_<ID>`` in their environment (never
on a command line); outside Airflow (the CLI) ``AIRFLOW_CONN_<ID>`` is read as JSON: login =
access key, password = secret key, ``extra.aws_session_token``, ``extra.endpoint_url``,
``extra.region_name``, ``extra.config_kwargs.s3.addressing_style``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from stateops.core.errors import StateOpsError

__all__ = [
    "S3Location",
    "S3Settings",
    "as_connection",
    "checkpoint_settings",
    "connection_settings",
    "names_a_url",
    "parse_s3_url",
    "s3_client",
    "s3_settings",
    "spark_s3_conf",
]


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # no leading or trailing slash; may be empty

    def key(self, *parts: str) -> str:
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


def names_a_url(text: str) -> bool:
    """Whether an argument that is a query's name or a URL is meant as a URL: a query's name
    has neither a colon nor a slash, so a mistyped URL is refused as a URL (what is wrong with
    it), not looked up as a query that is not registered."""
    return ":" in text or "/" in text


def parse_s3_url(url: str) -> S3Location:
    """``s3://BUCKET[/PREFIX]``; anything else is refused in one line that says what is wrong."""
    problem = _s3_url_problem(url)
    if problem:
        raise StateOpsError(f"{url}: not an S3 URL ({problem}); use s3://BUCKET/PREFIX")
    bucket, _, prefix = url[5:].partition("/")
    return S3Location(bucket, prefix.strip("/"))


def _s3_url_problem(url: str) -> str | None:
    scheme, sep, rest = url.partition("://")
    if not sep:
        if url.lower().startswith("s3"):
            return "its scheme is not written s3://"
        return "it does not begin with s3://"
    if scheme != "s3":
        return f"its scheme is {scheme}://, here it is s3://"
    if not rest.split("/", 1)[0]:
        return "no bucket after s3://"
    if any(c.isspace() for c in url):
        return "it has a blank in it"
    return None


ADDRESSING_STYLES = ("path", "virtual", "auto")


@dataclass(frozen=True)
class S3Settings:
    endpoint_url: str | None
    region: str | None
    """None: the SDK's own choice (``AWS_DEFAULT_REGION``, the profile, the bucket's region)."""
    access_key: str | None
    secret_key: str | None = None
    session_token: str | None = None
    """With temporary keys (an assumed role, web identity): valid until they expire."""
    addressing_style: str | None = None
    """``path``, ``virtual`` or ``auto``; None: path-style with an endpoint (S3-compatible
    servers), else the SDK's choice (virtual-hosted on AWS)."""

    def __post_init__(self) -> None:
        if self.addressing_style not in (None, *ADDRESSING_STYLES):
            raise StateOpsError(
                f"S3 addressing style {self.addressing_style!r}: expected one of "
                f"{', '.join(ADDRESSING_STYLES)} (an aws connection's "
                "extra.config_kwargs.s3.addressing_style)"
            )

    @property
    def path_style(self) -> bool:
        if self.addressing_style is None:
            return self.endpoint_url is not None
        return self.addressing_style == "path"

    def __repr__(self) -> str:  # never the secret, not even in a traceback's locals
        return f"S3Settings(endpoint_url={self.endpoint_url!r}, region={self.region!r})"


def connection_settings(
    login: str | None, password: str | None, extra: dict[str, Any]
) -> S3Settings:
    """An Airflow ``aws`` connection's fields as settings: the keys (login and password, or
    ``extra.aws_access_key_id`` and ``extra.aws_secret_access_key``), ``extra.aws_session_token``,
    ``extra.endpoint_url``, ``extra.region_name`` and ``extra.config_kwargs.s3.addressing_style``,
    as Airflow's AWS hook reads them. The region defaults to us-east-1 with an endpoint (an
    S3-compatible server), else to the SDK's choice."""
    s3_config = (extra.get("config_kwargs") or {}).get("s3") or {}
    endpoint = extra.get("endpoint_url") or None
    return S3Settings(
        endpoint_url=endpoint,
        region=extra.get("region_name") or ("us-east-1" if endpoint else None),
        access_key=login or extra.get("aws_access_key_id"),
        secret_key=password or extra.get("aws_secret_access_key"),
        session_token=extra.get("aws_session_token"),
        addressing_style=s3_config.get("addressing_style"),
    )


def as_connection(settings: S3Settings) -> str:
    """``settings`` as an ``aws`` connection's JSON (what :func:`s3_settings` reads back), for a
    process's environment only: it holds the secret."""
    extra: dict[str, Any] = {}
    if settings.endpoint_url:
        extra["endpoint_url"] = settings.endpoint_url
    if settings.region:
        extra["region_name"] = settings.region
    if settings.session_token:
        extra["aws_session_token"] = settings.session_token
    if settings.addressing_style:
        extra["config_kwargs"] = {"s3": {"addressing_style": settings.addressing_style}}
    conn = {"conn_type": "aws", "login": settings.access_key, "password": settings.secret_key}
    return json.dumps(conn | {"extra": extra})


def s3_settings(conn_id: str | None = None) -> S3Settings:
    """From Airflow connection ``conn_id`` (its ``AIRFLOW_CONN_*`` variable) or the environment."""
    env = os.environ
    if conn_id:
        raw = env.get(f"AIRFLOW_CONN_{conn_id.upper()}")
        if raw is None:
            raise StateOpsError(
                f"connection {conn_id!r}: AIRFLOW_CONN_{conn_id.upper()} is not set "
                "(JSON: conn_type aws, login, password, extra.endpoint_url)"
            )
        try:
            conn = json.loads(raw)
            extra = conn.get("extra") or {}
            extra = json.loads(extra) if isinstance(extra, str) else extra
        except (ValueError, AttributeError):
            raise StateOpsError(
                f"connection {conn_id!r}: AIRFLOW_CONN_{conn_id.upper()} is not JSON"
            ) from None
        return connection_settings(conn.get("login"), conn.get("password"), extra)
    endpoint = env.get("STATEOPS_S3_ENDPOINT_URL") or env.get("AWS_ENDPOINT_URL") or None
    return S3Settings(
        endpoint_url=endpoint,
        region=env.get("AWS_DEFAULT_REGION")
        or env.get("AWS_REGION")
        or ("us-east-1" if endpoint else None),
        access_key=env.get("AWS_ACCESS_KEY_ID"),
        secret_key=env.get("AWS_SECRET_ACCESS_KEY"),
        session_token=env.get("AWS_SESSION_TOKEN"),
    )


CHECKPOINT_CONN_ENV = "STATEOPS_CHECKPOINT_CONN_ID"


def checkpoint_settings() -> S3Settings:
    """The settings of checkpoints (and sinks, and the control store) in S3, for the library
    and Spark alike: the Airflow connection named by ``STATEOPS_CHECKPOINT_CONN_ID`` (the
    registry's ``connections.checkpoint``, :func:`use_checkpoint_connection`, else the
    deployment's), else the environment."""
    return s3_settings(os.environ.get(CHECKPOINT_CONN_ENV))


def use_checkpoint_connection(conn_id: str | None) -> None:
    """Make Airflow connection ``conn_id`` (a registry's ``connections.checkpoint``) the one
    this process and the jobs it starts read S3 with: S3A and the library's clients keep one
    setting per process. None leaves the deployment's."""
    if conn_id:
        os.environ[CHECKPOINT_CONN_ENV] = conn_id


# Spark's S3A connector (hadoop-aws) and the checkpoint file manager for s3a:// checkpoints.
S3A_CREDENTIALS = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
S3A_TEMPORARY_CREDENTIALS = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"


def spark_s3_conf(settings: S3Settings) -> dict[str, str]:
    """``settings`` as Spark's (``spark.hadoop.fs.s3a.*``): the endpoint (plain http when it
    says so), the region and the addressing style when given, and the keys (with a session
    token: temporary ones) when given, else S3A's own chain (the environment, the instance's
    role). Set on the session inside the job, never on a command
    line (where ``ps`` and the Airflow task log would show the secret).

    Reads use S3A's classic stream. Hadoop 3.5's default, the analytics accelerator, is made for
    columnar files; its file system keeps an entry for every object it read until it closes
    (HADOOP-20058), and a streaming driver reads new log and state files every batch for as
    long as it runs; it also once failed a read of a state metadata file under load in CI
    ("Error accessing ...", not reproduced since)."""
    _check_endpoint(settings.endpoint_url)
    conf = {"fs.s3a.input.stream.type": "classic"}
    if settings.region:
        conf["fs.s3a.endpoint.region"] = settings.region
    if settings.endpoint_url:
        https = settings.endpoint_url.startswith("https:")
        conf |= {
            "fs.s3a.endpoint": settings.endpoint_url,
            "fs.s3a.connection.ssl.enabled": "true" if https else "false",
        }
    if settings.endpoint_url or settings.addressing_style:
        conf["fs.s3a.path.style.access"] = "true" if settings.path_style else "false"
    if settings.access_key and settings.secret_key:
        conf |= {
            "fs.s3a.aws.credentials.provider": (
                S3A_TEMPORARY_CREDENTIALS if settings.session_token else S3A_CREDENTIALS
            ),
            "fs.s3a.access.key": settings.access_key,
            "fs.s3a.secret.key": settings.secret_key,
        }
        if settings.session_token:
            conf["fs.s3a.session.token"] = settings.session_token
    return {f"spark.hadoop.{key}": value for key, value in conf.items()}


def _check_endpoint(url: str | None) -> None:
    """Refuse an endpoint that is not an http(s) URL before boto3 does (with a bare
    ``ValueError`` that names neither the setting nor the fix)."""
    from urllib.parse import urlsplit

    if url is None:
        return
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 -- raises on a port that is not a number
    except ValueError:
        ok = False
    if not ok:
        raise StateOpsError(
            f"S3 endpoint {url!r} is not a URL; set STATEOPS_S3_ENDPOINT_URL (or the connection's "
            "extra.endpoint_url) to http(s)://HOST[:PORT], or unset it for AWS"
        )


def s3_client(settings: S3Settings, retries: int = 3) -> Any:
    """A client for ``settings``; ``retries``: how often a request that failed on a
    connection, a timeout or throttling is tried again (standard backoff between tries)."""
    import boto3
    from botocore.config import Config

    _check_endpoint(settings.endpoint_url)

    return boto3.client(
        "s3",
        endpoint_url=settings.endpoint_url,
        region_name=settings.region,
        aws_access_key_id=settings.access_key,
        aws_secret_access_key=settings.secret_key,
        aws_session_token=settings.session_token,
        config=Config(
            retries={"max_attempts": retries, "mode": "standard"},  # retries, not tries
            connect_timeout=5,
            read_timeout=60,
            s3={
                "addressing_style": "path"
                if settings.path_style
                else settings.addressing_style or "auto"
            },
            max_pool_connections=16,
        ),
    )
