"""The fleet's registry (make fleet): the Kafka queries, everything they keep in one bucket."""

from __future__ import annotations

import pytest

from stateops.core.registry import load_registry
from stateops.dev.fleet import fleet_registry
from tests.conftest import ROOT

pytestmark = pytest.mark.unit


def test_the_fleets_registry_keeps_every_querys_state_and_leases_in_its_bucket(tmp_path):
    dest = tmp_path / "registry.yaml"
    names = fleet_registry(ROOT / "registry.yaml", dest, "fleet-bucket")
    registry = load_registry(dest, switched=False)
    kafka = [
        n
        for n, q in load_registry(ROOT / "registry.yaml").queries.items()
        if q.source.format == "kafka"
    ]
    assert names == kafka == list(registry.queries) and names
    assert registry.control == "s3://fleet-bucket/control"
    assert registry.backups.url == "s3://fleet-bucket/backups"
    for name, query in registry.queries.items():
        assert query.checkpoint == f"s3://fleet-bucket/checkpoints/{name}"
        assert query.sink.path == f"s3://fleet-bucket/output/{name}"
