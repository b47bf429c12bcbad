"""``python -m stateops.dev.s3server``: the embedded S3 endpoint on a port of one's choice."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from stateops.dev.s3server import _ephemeral_low, free_port
from tests.conftest import S3_KEY, S3_SECRET

pytestmark = pytest.mark.unit


def test_the_embedded_endpoint_starts_on_the_port_and_with_the_bucket_given(tmp_path):
    from stateops.core.s3 import S3Settings, s3_client

    port = free_port()
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": S3_KEY,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET,
        "STATEOPS_S3_ENDPOINT_URL": "http://127.0.0.1:9000",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stateops.dev.s3server",
            str(tmp_path),
            "--port",
            str(port),
            "--bucket",
            "elsewhere",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        assert (
            proc.stdout.readline() == f"S3 endpoint {url} (bucket elsewhere) serving {tmp_path}\n"
        )
        assert proc.stdout.readline() == f"for the CLI: export STATEOPS_S3_ENDPOINT_URL={url}\n"
        client = s3_client(S3Settings(url, "us-east-1", S3_KEY, S3_SECRET))
        assert [b["Name"] for b in client.list_buckets()["Buckets"]] == ["elsewhere"]
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_without_credentials_it_says_which_to_set():
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.run(
        [sys.executable, "-m", "stateops.dev.s3server", "/nonexistent", "--port", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (the keys the endpoint takes; "
        "source scripts/env.sh for the demo ones)\n"
    )


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    """Below the range where Spark's binds to port 0 and outgoing connections take theirs,
    so a server starting seconds later still finds its port free."""
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(10_000 <= p < _ephemeral_low() for p in ports), ports
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))
