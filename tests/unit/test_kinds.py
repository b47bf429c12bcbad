"""The source and sink kinds as the registry spells them (stateops.kinds): each kind refuses
what it cannot read or write as written, in one line, and the fields of another kind are
refused naming whose they are."""

from __future__ import annotations

import json

import pytest
import yaml
from pydantic import ValidationError

from stateops.core.registry import load_registry
from stateops.kinds import SINK_FORMATS, SOURCE_FORMATS, Sink, Source
from tests.conftest import write_registry

pytestmark = pytest.mark.unit

KAFKA = {"format": "kafka", "topic": "t", "schema": "value STRING"}
FILES = {"format": "json", "path": "/in", "schema": "a STRING"}


def test_each_spelling_names_its_kind():
    assert SOURCE_FORMATS == ("json", "parquet", "csv", "kafka", "delta")
    assert SINK_FORMATS == ("parquet", "json", "kafka", "delta", "function")
    assert {
        Source.model_validate({**FILES, "format": f}).kind.name for f in SOURCE_FORMATS[:3]
    } == {"files"}
    assert Source.model_validate(KAFKA).kind.name == "kafka"
    assert Sink.model_validate({"path": "/out"}).kind.name == "folder"
    with pytest.raises(ValidationError, match="'avro' is not a format; one of 'json', "):
        Source.model_validate({**FILES, "format": "avro"})


@pytest.mark.parametrize(
    "spec, says",
    [
        ({**KAFKA, "encoding": "raw", "schema": "value STRING, size INT"}, "schema size: a raw"),
        ({**KAFKA, "encoding": "raw", "malformed": "count"}, "malformed is for json and avro"),
        ({**KAFKA, "schema": "_stateops_malformed STRING"}, "the name is stateops' own"),
        ({**FILES, "encoding": "raw"}, "encoding raw is for kafka sources"),
        ({**FILES, "malformed": "count"}, "error, malformed is for kafka sources, not"),
        ({**FILES, "topic": "t", "connection": "k"}, "topic and connection are for kafka sources"),
        ({**KAFKA, "malformed": "skip"}, "malformed"),
    ],
    ids=["raw-column", "raw-malformed", "own-column", "files-raw", "files-malformed",
         "files-topic", "malformed-spelling"],
)  # fmt: skip
def test_a_source_refuses_what_its_kind_does_not_read(spec, says):
    with pytest.raises(ValidationError, match=says):
        Source.model_validate(spec)


def test_a_raw_record_takes_any_of_sparks_record_columns():
    spec = {**KAFKA, "encoding": "raw"}
    columns = "key BINARY, value STRING, topic STRING, partition INT, offset BIGINT, timestamp "
    columns += "TIMESTAMP, timestampType INT, headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
    assert Source.model_validate({**spec, "schema": columns}).encoding == "raw"


VISIT = {
    "type": "record",
    "name": "Visit",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "page", "type": ["null", "string"]},
        {"name": "n", "type": "int"},
        {"name": "size", "type": "float"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "seq", "type": "long"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}
AVRO = {**KAFKA, "encoding": "avro", "avro_schema": VISIT}


@pytest.mark.parametrize(
    "spec, says",
    [
        ({**KAFKA, "encoding": "avro"}, "encoding: avro needs avro_schema: the writer's"),
        ({**KAFKA, "avro_schema": VISIT}, "avro_schema is for Avro values: give encoding: avro"),
        ({**AVRO, "avro_schema": "{not json"}, r"avro_schema is not JSON \(.*line 1"),
        ({**AVRO, "avro_schema": '"string"'}, "avro_schema is not a record schema"),
        ({**AVRO, "schema": "user STRING, city STRING"}, r"schema city: not a field of .*user"),
        ({**AVRO, "schema": "user INT"}, "schema user INT: the Avro field is string, which reads"),
        ({**AVRO, "schema": "seq TIMESTAMP"}, "declare it with logicalType timestamp-millis"),
        ({**AVRO, "schema": "n BOOLEAN"}, "the Avro field is int, which reads as INT or BIGINT"),
        ({**AVRO, "encoding": "raw"}, "avro_schema is for Avro values"),
        ({**FILES, "avro_schema": VISIT}, "avro_schema is for kafka sources"),
    ],
    ids=["no-schema", "no-encoding", "not-json", "not-record", "not-a-field", "not-its-type",
         "long-as-time", "int-as-bool", "raw-with-schema", "files"],
)  # fmt: skip
def test_an_avro_source_refuses_a_schema_that_does_not_read_its_values(spec, says):
    with pytest.raises(ValidationError, match=says):
        Source.model_validate(spec)


def test_an_avro_source_takes_its_fields_widened_or_as_text_and_the_avsc_text():
    columns = "user STRING, page STRING, n LONG, size DOUBLE, at TIMESTAMP, seq STRING"
    source = Source.model_validate({**AVRO, "schema": columns + ", tags ARRAY<STRING>"})
    assert json.loads(source.avro_schema or "") == VISIT
    text = Source.model_validate({**AVRO, "avro_schema": json.dumps(VISIT), "schema": "n INT"})
    assert text.avro_schema == json.dumps(VISIT)
    assert source.kind.jars(source) == ("spark-sql-kafka", "spark-avro")
    assert source.kind.jars(Source.model_validate(KAFKA)) == ("spark-sql-kafka",)


def test_a_sink_refuses_the_fields_of_another_kind():
    with pytest.raises(ValidationError, match="topic and key are for kafka sinks, not for a"):
        Sink.model_validate({"path": "/out", "topic": "t", "key": "k"})
    with pytest.raises(ValidationError, match="a kafka sink writes a topic"):
        Sink.model_validate({"format": "kafka", "path": "/out", "topic": "t"})


def test_a_migrated_kafka_sink_numbers_its_batches_on_as_a_folder_does():
    """A migration's switch gives any sink the old checkpoint's numbering (batch_offset):
    it is no kind's own field."""
    sink = Sink.model_validate({"format": "kafka", "topic": "out", "batch_offset": 8})
    assert sink.folder_batch(0) == 8


def test_two_queries_writing_one_folder_or_table_are_each_refused(tmp_path):
    path = write_registry(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["queries"]["page_visits_too"] = {
        **raw["queries"]["page_visits"],
        "checkpoint": "checkpoints/page_visits_too",
    }
    raw["queries"]["page_visits"]["sink"] = {"format": "delta", "path": "tables/visits"}
    raw["queries"]["page_visits_too"]["sink"] = {"format": "delta", "path": "tables/visits/"}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    registry = load_registry(path)
    assert "page_visits" not in registry.queries and "page_visits_too" not in registry.queries
    said = registry.invalid["page_visits_too"]
    assert said.startswith("query page_visits_too: its delta sink ")
    assert "is also written by page_visits: " in said and "\n" not in said
    assert "page_counts" in registry.queries, "the others stand"
