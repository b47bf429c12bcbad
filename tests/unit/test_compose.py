"""docker-compose.yaml, checked without Docker (Docker cannot run here): it parses, every image
is pinned, mounted paths exist, published ports do not clash, and MinIO matches what the code
reads (the demo credentials of scripts/env.sh, the bucket of the registry's backups.url)."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from stateops.registry import load_registry
from stateops.s3 import parse_s3_url
from tests.conftest import ROOT

pytestmark = pytest.mark.unit

SERVICES = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())["services"]


def _env_sh_defaults() -> dict[str, str]:
    script = f"env -i bash -c 'source {ROOT}/scripts/env.sh && env'"
    out = subprocess.run(script, shell=True, capture_output=True, text=True, check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_every_image_is_pinned_to_a_release():
    for name, service in SERVICES.items():
        repo, _, tag = service["image"].rpartition(":")
        assert repo and tag and tag != "latest", f"{name}: {service['image']} is not pinned"
    assert SERVICES["spark-master"]["image"].startswith("apache/spark:4.2.0")  # = pyspark pin
    assert "pyspark==4.2.0" in (ROOT / "requirements.txt").read_text()


def test_mounted_paths_exist_and_ports_do_not_clash():
    published = []
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists() or source == "./data", f"{name}: {source}"
        published += [port.rsplit(":", 1)[0] for port in service.get("ports", [])]
    assert len(published) == len(set(published)), published
    assert all(port.startswith("127.0.0.1:") for port in published)  # loopback only


def test_minio_is_the_backup_endpoint_the_code_reads():
    env = _env_sh_defaults()
    minio = SERVICES["minio"]
    assert minio["environment"]["MINIO_ROOT_USER"] == env["AWS_ACCESS_KEY_ID"]
    assert minio["environment"]["MINIO_ROOT_PASSWORD"] == env["AWS_SECRET_ACCESS_KEY"]
    port = re.search(r":(\d+)$", env["STATEOPS_S3_ENDPOINT_URL"]).group(1)
    assert f"127.0.0.1:{port}:9000" in minio["ports"]
    bucket = parse_s3_url(load_registry(ROOT / "registry.yaml").backups.url).bucket
    init = SERVICES["minio-init"]["entrypoint"]
    assert f"mc mb --ignore-existing local/{bucket}" in init
    assert f"{env['AWS_ACCESS_KEY_ID']} {env['AWS_SECRET_ACCESS_KEY']}" in init
