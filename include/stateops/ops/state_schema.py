"""The state schemas a query's code declares and a checkpoint holds, read without Spark: a
``transformWithState`` operator's properties and schema files (format v3), a processor's
state variables as its ``init`` declares them, and their comparison's vocabulary. The
transplant (:mod:`stateops.ops.transplant`) and the code upgrade (:mod:`stateops.ops.upgrade`)
ask it."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from stateops.core.checkpoint import Checkpoint
from stateops.core.errors import CheckpointError
from stateops.core.formats import schema_file_refs
from stateops.core.registry import Query, schema_fields

__all__ = [
    "KINDS",
    "OPERATOR",
    "TIME_MODES",
    "declared_fields",
    "declared_state",
    "grouping_key",
    "operator_properties",
    "operator_state",
    "read_state_schema",
    "show",
    "split_key",
    "type_name",
    "user_variables",
]

OPERATOR = "transformWithStateInPandasExec"
TIME_MODES = {"None": "NoTime", "EventTime": "EventTime", "ProcessingTime": "ProcessingTime"}
KINDS = {"value": "ValueState", "list": "ListState", "map": "MapState"}
# DDL type names -> the names Spark's JSON schemas use.
JSON_TYPES = {
    "STRING": "string",
    "BIGINT": "long",
    "LONG": "long",
    "INT": "integer",
    "INTEGER": "integer",
    "SMALLINT": "short",
    "SHORT": "short",
    "TINYINT": "byte",
    "BYTE": "byte",
    "BOOLEAN": "boolean",
    "DOUBLE": "double",
    "FLOAT": "float",
    "REAL": "float",
    "DATE": "date",
    "TIMESTAMP": "timestamp",
    "TIMESTAMP_NTZ": "timestamp_ntz",
    "BINARY": "binary",
}


def read_state_schema(path: Path) -> dict[str, dict[str, list[tuple[str, str]]]]:
    """Column family -> its key and value fields ``(name, type)``, from a ``_stateSchema`` file
    (format v3: Java ``writeUTF`` strings, JSON schemas in ``writeUTF`` chunks)."""
    data, pos = path.read_bytes(), 0

    def take(fmt: str) -> int:
        nonlocal pos
        (value,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return value

    def utf() -> str:
        nonlocal pos
        size = take(">H")
        pos += size
        if pos > len(data):
            raise ValueError("truncated")
        return data[pos - size : pos].decode("utf-8")

    def chunked() -> str:
        return "".join(utf() for _ in range(take(">i")))

    def fields(text: str) -> list[tuple[str, str]]:
        return [(f["name"], type_name(f["type"])) for f in json.loads(text)["fields"]]

    try:
        if utf() != "v3":
            raise ValueError("not a v3 schema file")
        families = {}
        for _ in range(take(">i")):
            name = utf()
            take(">h")
            key = fields(chunked())
            take(">h")
            value = fields(chunked())
            chunked()  # the key encoder spec
            chunked()  # the user key encoder's schema (map state)
            families[name] = {"key": key, "value": value}
    except (ValueError, KeyError, TypeError, struct.error) as err:
        raise CheckpointError(f"{path}: unreadable state schema file ({err})") from err
    if pos != len(data):
        raise CheckpointError(
            f"{path}: unreadable state schema file ({len(data) - pos} bytes left)"
        )
    return families


def type_name(kind: Any) -> str:
    return kind if isinstance(kind, str) else json.dumps(kind, sort_keys=True)


def declared_fields(schema: Any) -> list[tuple[str, str]]:
    """``(name, Spark JSON type)`` of a schema a processor declares (DDL string or StructType)."""
    if not isinstance(schema, str):
        return [(f["name"], type_name(f["type"])) for f in schema.jsonValue()["fields"]]
    out = []
    for name, kind in schema_fields(schema):
        if kind.startswith("DECIMAL"):
            kind = kind.replace(" ", "").lower()
        out.append((name, JSON_TYPES.get(kind, kind.lower())))
    return out


def operator_properties(cp: Checkpoint, batch: int) -> tuple[dict, list[str]]:
    """The transformWithState operator's properties and the schema files it names at ``batch``,
    oldest first (a later one holds the evolved schema)."""
    op = cp.operators[0]
    v2 = [b for b in op.metadata_files if b is not None and b <= batch]
    if not v2:
        raise CheckpointError(f"{cp.root}: no operator metadata v2 at batch {batch}")
    rel = op.metadata_files[max(v2)]
    header, _, body = (cp.root / rel).read_text(encoding="utf-8").partition("\n")
    meta = json.loads(body.split("\n")[0])
    props = json.loads(meta.get("operatorPropertiesJson") or "{}")
    refs = schema_file_refs(cp.root, rel, op.operator_id)
    return props, sorted(refs, key=lambda ref: int(ref.rpartition("/")[2].split("_")[0]))


def grouping_key(query: Query) -> list[tuple[str, str]]:
    """The processor's grouping key as its state keys hold it: ``(column, Spark JSON type)``
    per key column, from the source's schema (``?``: a column the source does not have)."""
    types = dict(declared_fields(query.source.schema_))
    return [(k, types.get(k, "?")) for k in query.key_columns]


def operator_state(cp: Checkpoint, batch: int) -> tuple[dict, dict[str, Any]]:
    """The transformWithState operator's properties at ``batch`` and its column families'
    key and value fields (:func:`read_state_schema`), a later schema file's (an evolved
    schema) winning."""
    props, refs = operator_properties(cp, batch)
    families: dict[str, Any] = {}
    for rel in refs:
        families.update(read_state_schema(cp.root / rel))
    with_ttl = {n for n, v in user_variables(props).items() if v.get("ttlEnabled")}
    return props, {n: _without_ttl(f) if n in with_ttl else f for n, f in families.items()}


def _without_ttl(family: dict[str, Any]) -> dict[str, Any]:
    """A variable with TTL as its code declares it: Spark stores each of its values (a list's
    elements, a map's values) wrapped as ``{value: <the declared fields>, ttlExpirationMs}``."""
    value = family["value"]
    if [name for name, _ in value] != ["value", "ttlExpirationMs"]:
        return family
    declared = json.loads(value[0][1])["fields"]
    return {**family, "value": [(f["name"], type_name(f["type"])) for f in declared]}


def user_variables(props: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The operator's state variables (``props``: :func:`operator_properties`) by name, its
    timers and Spark's internal ones (``$...``) left out."""
    return {
        v["stateName"]: v
        for v in props.get("stateVariables", [])
        if v.get("stateVariableType") != "TimerState" and not v["stateName"].startswith("$")
    }


def declared_state(query: Query) -> dict[str, dict[str, Any]]:
    """The state variables the registry's processor declares in ``init``: name -> kind, ttl,
    value (and map key) fields."""
    from stateops.spark.simulator import SimulatedHandle
    from stateops.spark.streaming import load_processor

    ttls: dict[str, bool] = {}

    class Recorder(SimulatedHandle):
        def _declare(self, variable: Any, ttl: int | None) -> Any:
            ttls[variable.name] = ttl is not None
            return self.variables.setdefault(variable.name, variable)

    handle = Recorder(query.processor.time_mode, 0)
    load_processor(query).init(handle)
    return {
        name: {
            "kind": var.kind,
            "ttl": ttls[name],
            "value": declared_fields(var.schema),
            "user_key": declared_fields(var.key_schema) if var.kind == "map" else None,
        }
        for name, var in handle.variables.items()
    }


def split_key(
    fields: list[tuple[str, str]],
) -> tuple[list[tuple[str, str]], list[tuple[str, str]] | None]:
    """A state variable's key fields in its schema file as (grouping key, a map's user key):
    a map state's key is two structs, ``key`` and ``userKey``."""
    if [name for name, _ in fields] != ["key", "userKey"]:
        return fields, None
    grouping, user = (
        [(f["name"], type_name(f["type"])) for f in json.loads(kind)["fields"]]
        for _, kind in fields
    )
    return grouping, user


def show(fields: list[tuple[str, str]]) -> str:
    return "(" + ", ".join(f"{n} {t}" for n, t in fields) + ")"
