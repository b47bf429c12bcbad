"""Airflow's own connections (issue 75 item 3): the registry names them (``connections``, a
Kafka source's or sink's ``connection``); tests/dag/test_connections.py: a task resolves them."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from stateops.core.errors import RegistryError
from stateops.core.registry import load_registry
from tests.conftest import ROOT, write_registry

pytestmark = pytest.mark.unit


SECRET = "backend-secret-not-for-logs"
KAFKA_SECRET = "kafka-pass-not-for-logs"


def _registry(tmp_path, connections=None, **overrides):
    path = write_registry(tmp_path, True, **overrides)
    raw = yaml.safe_load(path.read_text())
    if connections is not None:
        raw["connections"] = connections
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _kafka_query(registry):
    return next(q for q in registry.queries.values() if q.source and q.source.format == "kafka")


def test_each_kafka_source_and_sink_has_a_connection_its_own_or_the_registry_s(tmp_path):
    registry = load_registry(_registry(tmp_path))
    assert registry.connections.checkpoint is None
    query = _kafka_query(registry)
    assert query.source.connection == "kafka_default"
    files = [q for q in registry.queries.values() if q.source and q.source.format != "kafka"]
    assert files and all(q.source.connection is None for q in files)
    assert all(q.sink.connection is None for q in files if q.sink.format != "kafka")

    name = query.name
    raw_source = yaml.safe_load((ROOT / "registry.yaml").read_text())["queries"][name]["source"]
    own = {name: {"source": {**raw_source, "connection": "kafka_eu"}}}
    registry = load_registry(
        _registry(tmp_path, {"kafka": "kafka_team", "checkpoint": "ckpt_store"}, **own)
    )
    assert registry.query(name).source.connection == "kafka_eu"
    assert registry.connections.checkpoint == "ckpt_store"


def test_a_connection_where_it_does_not_belong_or_misspelled_is_refused(tmp_path):
    registry = load_registry(_registry(tmp_path))
    file_query = next(
        q for q in registry.queries.values() if q.source and q.source.format != "kafka"
    )
    raw = yaml.safe_load((ROOT / "registry.yaml").read_text())["queries"][file_query.name]
    bad = {file_query.name: {"source": {**raw["source"], "connection": "kafka_eu"}}}
    registry = load_registry(_registry(tmp_path, **bad))
    said = registry.invalid[file_query.name]
    assert "source: connection is for kafka sources, not for a json one" in said
    with pytest.raises(RegistryError, match=r"connections\.checkpoint: String should match"):
        load_registry(_registry(tmp_path, {"checkpoint": "aws default"}))


def test_the_cli_and_the_jobs_read_s3_through_the_registry_s_checkpoint_connection(
    tmp_path, monkeypatch
):
    from stateops.core.registry import use_connections
    from stateops.core.s3 import CHECKPOINT_CONN_ENV, checkpoint_settings

    conn = {"conn_type": "aws", "login": "AKTEAM", "password": "x", "extra": {}}
    monkeypatch.setenv("AIRFLOW_CONN_TEAM_S3", json.dumps(conn))
    monkeypatch.setenv(CHECKPOINT_CONN_ENV, "deployment_s3")  # the deployment's default
    use_connections(_registry(tmp_path))  # names none: the deployment's stays
    assert os.environ[CHECKPOINT_CONN_ENV] == "deployment_s3"
    use_connections(_registry(tmp_path, {"checkpoint": "team_s3"}))
    assert checkpoint_settings().access_key == "AKTEAM"
    use_connections(tmp_path / "missing.yaml")  # the command says what is wrong with it
    assert os.environ[CHECKPOINT_CONN_ENV] == "team_s3"
