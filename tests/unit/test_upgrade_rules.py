"""The code upgrade check's rules (stateops.ops.upgrade) for the changes that no Spark test
restarts: a narrowed key, a variable's kind, a TTL added, the time mode and a map's key type,
which Spark 4.2 was seen to refuse on checkpoints it wrote (docs/code-upgrades.md's table), and
Avro's widenings and refusals beyond INT to LONG, which follow Avro's type promotions (not
observed on Spark). Pure logic: the checkpoint's side as the check reads it from the operator
metadata and the schema files, the new code's as it records ``init``."""

from __future__ import annotations

import json

import pytest

from stateops.core.registry import load_registry
from stateops.ops.upgrade import (
    EVOLVES,
    REWRITE,
    UNCHANGED,
    _avro_refusal,
    _key_change,
    _map_key_change,
    _processor_changes,
    _variable_change,
)
from tests.conftest import write_registry

pytestmark = pytest.mark.unit

USER = [("user_id", "string")]
USER_PAGE = [("user_id", "string"), ("page", "string")]
COUNT = [("visits", "long")]


def _old(kind: str = "ValueState", ttl: bool = False) -> dict:
    """A state variable as the operator metadata records it."""
    return {"stateName": "count", "stateVariableType": kind, "ttlEnabled": ttl}


def _new(kind: str = "value", ttl: bool = False, value=COUNT, user_key=None) -> dict:
    """A state variable as the new code declares it in ``init``."""
    return {"kind": kind, "ttl": ttl, "value": value, "user_key": user_key}


def _families(value=COUNT, key=USER) -> dict:
    return {"count": {"key": key, "value": value}}


def test_a_narrowed_key_needs_a_rewrite_and_a_renamed_key_column_does_not():
    assert _key_change(USER_PAGE, USER).verdict == REWRITE
    assert _key_change(USER, USER_PAGE).verdict == REWRITE
    assert _key_change(USER, [("visitor", "string")]).verdict == UNCHANGED
    assert _key_change(USER, [("user_id", "long")]).verdict == REWRITE


@pytest.mark.parametrize("avro", [False, True])
def test_a_variable_of_another_kind_or_with_a_ttl_needs_a_rewrite_with_either_encoding(avro):
    kind = _variable_change("count", _old(), _new(kind="list"), _families(), avro)
    assert kind.verdict == REWRITE and "another kind" in kind.detail
    ttl = _variable_change("count", _old(), _new(ttl=True), _families(), avro)
    assert ttl.verdict == REWRITE and "TTL off in the checkpoint, on in the new code" in ttl.detail


def test_a_changed_time_mode_needs_a_rewrite(tmp_path):
    query = load_registry(write_registry(tmp_path)).query("page_visits")
    props = {"timeMode": "EventTime", "outputMode": query.processor.output_mode,
             "stateVariables": [_old()]}  # fmt: skip
    changes = _processor_changes(query, props, _families(), {"count": _new()}, avro=False)
    assert [(c.what, c.verdict) for c in changes] == [
        ("time mode", REWRITE),
        ("key", UNCHANGED),
        ("state 'count'", UNCHANGED),
    ], [c.line() for c in changes]


def _struct(fields: list[tuple[str, str]]) -> str:
    """A struct's JSON as a map state's schema file holds its key and user key."""
    return json.dumps(
        {
            "type": "struct",
            "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields],
        }
    )


def test_a_map_key_whose_type_changed_needs_a_rewrite():
    families = {
        "views": {
            "key": [("key", _struct(USER)), ("userKey", _struct([("page", "string")]))],
            "value": [("n", "long")],
        }
    }
    same = _new("map", value=[("n", "long")], user_key=[("url", "string")])
    assert _map_key_change("views", USER, same, families) is None  # renamed, same type
    retyped = _new("map", value=[("n", "long")], user_key=[("page", "integer")])
    change = _map_key_change("views", USER, retyped, families)
    assert change is not None and change.verdict == REWRITE
    assert "(page string) in the checkpoint, (page integer) in the new code" in change.detail


@pytest.mark.parametrize(
    ("old", "new", "refused"),
    [
        ([("n", "integer")], [("n", "double")], False),
        ([("n", "long")], [("n", "float")], False),
        ([("n", "float")], [("n", "double")], False),
        ([("n", "long")], [("n", "integer")], True),  # narrowed
        ([("n", "double")], [("n", "float")], True),
        ([("n", "string")], [("n", "long")], True),
        ([("n", "long")], [("n", "string")], True),
        ([("a", "long"), ("b", "string")], [("b", "string"), ("a", "long")], False),  # reordered
    ],
)
def test_avro_widens_as_avro_promotes_and_refuses_the_rest(old, new, refused):
    assert (_avro_refusal(old, new) is not None) == refused
    change = _variable_change("count", _old(), _new(value=new), _families(value=old), True)
    assert change.verdict == (REWRITE if refused else EVOLVES), change.line()
    # Without Avro, a value schema that is not the same types in order is refused.
    plain = _variable_change("count", _old(), _new(value=new), _families(value=old), False)
    assert plain.verdict == REWRITE, plain.line()


def test_a_field_renamed_reads_null_under_avro_and_keeps_its_values_without():
    renamed = [("views", "long")]
    avro = _variable_change("count", _old(), _new(value=renamed), _families(), True)
    assert avro.verdict == EVOLVES and avro.drops, avro.line()
    assert "views read null" in avro.detail and "Spark drops visits" in avro.detail
    plain = _variable_change("count", _old(), _new(value=renamed), _families(), False)
    assert plain.verdict == UNCHANGED and not plain.drops, plain.line()
