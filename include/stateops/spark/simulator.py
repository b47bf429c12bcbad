"""A pure-Python stand-in for Spark's transformWithState runtime: one micro-batch, in memory.

The carry-over proof needs to know what state a batch *should* leave behind without asking
Spark's state store (the thing under test). This runs the query's own processor on pandas
input the way one micro-batch does: per key, the initial state rows (first batch only) and
then the input rows; then every timer that has expired. State lives in dictionaries; values
are normalised the way Spark's Python client normalises them before it stores them (NumPy and
pandas scalars become Python values), and their arity is checked against the declared schema
(their types are checked where the proof turns them into Spark rows).

It builds on PySpark's own in-memory runtime, ``pyspark.sql.streaming.tws_tester`` (the
``TwsTester``'s handle, state classes and timers), so the handle and each state object are
instances of Spark's ``StatefulProcessorHandle`` / ``ValueState`` / ``ListState`` /
``MapState``: a method Spark adds later is inherited, or fails loudly with a
:class:`StateOpsError` naming it (Spark's methods call a client the simulator does not have),
rather than being silently missing. Those classes are private to PySpark: they are imported
here without a guard because PySpark is pinned (requirements.in); a PySpark upgrade that moves
them fails at import. Kept of the project's own, where tws_tester differs: state keyed by the
whole grouping-key tuple; the normalisation and arity checks; TTL refused; timer misuse refused
with a :class:`StateOpsError`; snapshots for iterators (a processor may change the state while
it iterates); an emptied list or map is no state; ``deleteIfExists`` clears a variable but
keeps it declared; the watermark and Spark state-reader layout (:meth:`SimulatedHandle.load`,
:meth:`SimulatedHandle.rows`). ``TwsTester`` itself does not fit: it runs one single-column key
at a time and filters late rows itself (the proof passes the rows the old query kept).

No JVM: ``tws_tester`` imports only PySpark's Python side.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    ListState,
    MapState,
    StatefulProcessorHandle,
    TimerValues,
    ValueState,
)
from pyspark.sql.streaming.tws_tester import (
    _InMemoryListState,
    _InMemoryMapState,
    _InMemoryStatefulProcessorHandle,
    _InMemoryValueState,
)

from stateops.core.errors import StateOpsError
from stateops.core.registry import schema_columns

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SimulatedHandle", "simulate_batch"]


def _normalize(value: Any) -> Any:
    """What Spark's state client stores for ``value`` (its ``_serialize_to_bytes`` rules)."""
    import numpy as np

    if isinstance(value, np.generic):
        return value.tolist()
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "to_pytimedelta"):
        return value.to_pytimedelta()
    if hasattr(value, "to_pydatetime"):
        return None if value != value else value.to_pydatetime()  # NaT is not equal to itself
    if isinstance(value, tuple | list):
        return type(value)(_normalize(v) for v in value)
    if isinstance(value, dict):
        return {_normalize(k): _normalize(v) for k, v in value.items()}
    return value


def _columns(schema: Any) -> list[str]:
    """Column names of a declared schema: a DDL string (parsed without a JVM) or a StructType."""
    return schema_columns(schema) if isinstance(schema, str) else list(schema.fieldNames())


class _NoClient:
    """In place of the client Spark's state classes call: a Spark method the simulator neither
    defines nor inherits from tws_tester (one a later Spark adds) fails here, by name."""

    def __init__(self, owner: str) -> None:
        self.owner = owner

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise StateOpsError(
            f"the processor calls a {self.owner} method the simulator has no stand-in for "
            f"(Spark's client call {name!r})"
        )


class _Variable:
    """What the simulator adds to tws_tester's in-memory state classes (``self.state``: grouping
    key -> the key's state): normalisation, arity checks and the state-reader layout."""

    kind: str
    _spark: type  # Spark's public class, initialised with a _NoClient

    def __init__(self, handle: SimulatedHandle, name: str, schema: Any) -> None:
        super().__init__(handle)  # type: ignore[call-arg]  # tws_tester's: .handle, .state
        self._spark.__init__(self, _NoClient(self._spark.__name__), name)
        self.name, self.schema, self.columns = name, schema, _columns(schema)

    @property
    def data(self) -> dict[tuple, Any]:
        """Grouping key -> the key's state."""
        return self.state  # type: ignore[attr-defined]

    def _fit(self, value: Any, columns: list[str] | None = None) -> tuple:
        columns = columns or self.columns
        if not isinstance(value, tuple | list) or len(value) != len(columns):
            raise StateOpsError(
                f"state {self.name!r}: the processor wrote {value!r}, the declared schema has "
                f"{len(columns)} fields ({', '.join(columns)})"
            )
        return tuple(_normalize(v) for v in value)

    def rows(self) -> list[dict[str, Any]]:
        """The state as Spark's state reader lays it out for this kind of variable."""
        return [{"key": k, "value": v} for k, v in self.data.items()]

    def declared(self) -> dict[str, Any]:
        """Column of :meth:`rows` -> the schema the processor declared for it."""
        return {"value": self.schema}


class _ValueState(_Variable, _InMemoryValueState):
    kind, _spark = "value", ValueState

    def update(self, newValue: tuple) -> None:
        super().update(self._fit(newValue))


class _ListState(_Variable, _InMemoryListState):
    kind, _spark = "list", ListState

    def get(self) -> Iterator[tuple]:
        return iter(list(super().get()))

    def put(self, newState: list[tuple]) -> None:
        values = [self._fit(v) for v in newState]
        if values:
            super().put(values)
        else:
            self.clear()

    def appendValue(self, newState: tuple) -> None:
        super().appendValue(self._fit(newState))

    def appendList(self, newState: list[tuple]) -> None:
        values = [self._fit(v) for v in newState]
        if values:
            super().appendList(values)

    def rows(self) -> list[dict[str, Any]]:
        """One row per element, with its position in the list (``list_position``): the
        order is part of the state, and the proof compares it."""
        return [
            {"key": k, "list_element": e, "list_position": i}
            for k, items in self.data.items()
            for i, e in enumerate(items)
        ]

    def declared(self) -> dict[str, Any]:
        return {"list_element": self.schema}


class _MapState(_Variable, _InMemoryMapState):
    kind, _spark = "map", MapState

    def __init__(self, handle: SimulatedHandle, name: str, key_schema: Any, schema: Any) -> None:
        super().__init__(handle, name, schema)
        self.key_schema, self.key_columns = key_schema, _columns(key_schema)

    def _user_key(self, key: tuple) -> tuple:
        return self._fit(key, self.key_columns)

    def getValue(self, key: tuple) -> tuple | None:
        return super().getValue(self._user_key(key))

    def containsKey(self, key: tuple) -> bool:
        return super().containsKey(self._user_key(key))

    def updateValue(self, key: tuple, value: tuple) -> None:
        super().updateValue(self._user_key(key), self._fit(value))

    def iterator(self) -> Iterator[tuple[tuple, tuple]]:
        return iter(list(super().iterator()))

    def keys(self) -> Iterator[tuple]:
        return iter(list(super().keys()))

    def values(self) -> Iterator[tuple]:
        return iter(list(super().values()))

    def removeKey(self, key: tuple) -> None:
        super().removeKey(self._user_key(key))
        if not self.data.get(self.handle.grouping_key):
            self.clear()

    def rows(self) -> list[dict[str, Any]]:
        return [
            {"key": k, "user_map_key": mk, "user_map_value": mv}
            for k, entries in self.data.items()
            for mk, mv in entries.items()
        ]

    def declared(self) -> dict[str, Any]:
        return {"user_map_key": self.key_schema, "user_map_value": self.schema}


class SimulatedHandle(_InMemoryStatefulProcessorHandle):
    """Spark's ``StatefulProcessorHandle`` in memory (tws_tester's), keyed by the current
    grouping key (``setGroupingKey``), with the batch's watermark."""

    def __init__(self, time_mode: str, watermark_ms: int) -> None:
        super().__init__(timeMode=time_mode)
        StatefulProcessorHandle.__init__(self, _NoClient("StatefulProcessorHandle"))
        self.setWatermark(watermark_ms)
        self.variables: dict[str, _Variable] = {}

    @property
    def time_mode(self) -> str:
        return self._timeMode

    @property
    def watermark_ms(self) -> int:
        return self._currentWatermarkMs

    def _declare(self, variable: _Variable, ttl: int | None) -> Any:
        if ttl is not None:
            raise StateOpsError(
                f"state {variable.name!r} has a TTL: the proof cannot simulate expiry by "
                "processing time"
            )
        return self.variables.setdefault(variable.name, variable)

    def _get(self, variable: _Variable, ttl: int | None) -> Any:
        declared = self._declare(variable, ttl)
        if declared.kind == variable.kind:  # tws_tester's own registry of the kind
            getattr(self, f"{declared.kind}_states").setdefault(declared.name, declared)
        return declared

    def getValueState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> Any:
        return self._get(_ValueState(self, stateName, schema), ttlDurationMs)

    def getListState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> Any:
        return self._get(_ListState(self, stateName, schema), ttlDurationMs)

    def getMapState(
        self, stateName: str, userKeySchema: Any, valueSchema: Any, ttlDurationMs: int | None = None
    ) -> Any:
        return self._get(_MapState(self, stateName, userKeySchema, valueSchema), ttlDurationMs)

    def _timer_mode(self) -> None:
        if self.time_mode == "none":
            raise StateOpsError("the processor uses timers, but the query's time_mode is None")

    def registerTimer(self, expiryTimestampMs: int) -> None:
        self._timer_mode()
        if self.time_mode == "eventtime" and expiryTimestampMs <= self.watermark_ms:
            raise StateOpsError(
                f"timer {expiryTimestampMs} is not after the watermark {self.watermark_ms}"
            )
        super().registerTimer(int(expiryTimestampMs))

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        self._timer_mode()
        super().deleteTimer(int(expiryTimestampMs))

    def listTimers(self) -> Iterator[int]:
        self._timer_mode()
        return super().listTimers()  # a sorted copy

    def deleteIfExists(self, stateName: str) -> None:
        if stateName in self.variables:
            self.variables[stateName].data.clear()

    def load(self, name: str, rows: list[Any]) -> None:
        """Seed variable ``name`` (or ``"timers"``) with state as Spark's state reader lays it
        out (the rows of :meth:`rows`; struct values as tuples or Rows). List elements go in
        ``list_position`` order where the rows have one, else in the order given."""
        if name == "timers":
            for row in rows:
                self._timers.registerTimer(tuple(row["key"]), int(row["expiration_timestamp_ms"]))
            return
        variable = self.variables.get(name)
        if variable is None:
            raise StateOpsError(
                f"the old state has a variable {name!r} the processor does not declare"
            )
        if variable.kind == "list" and rows and "list_position" in _fields(rows[0]):
            rows = sorted(rows, key=lambda row: row["list_position"])  # in each key's order
        for row in rows:
            key, data = tuple(row["key"]), variable.data
            if variable.kind == "value":
                data[key] = tuple(row["value"])
            elif variable.kind == "list":
                data.setdefault(key, []).append(tuple(row["list_element"]))
            else:
                data.setdefault(key, {})[tuple(row["user_map_key"])] = tuple(row["user_map_value"])

    def rows(self, name: str) -> list[dict[str, Any]]:
        """The state of variable ``name`` (or ``"timers"``) as Spark's state reader lays it out."""
        if name == "timers":
            return [
                {"key": key, "expiration_timestamp_ms": t}
                for key in self._timers.getAllKeysWithTimers()
                for t in self._timers.listTimers(key)
            ]
        return self.variables[name].rows()


def _fields(row: Any) -> Any:
    """The field names of a state row: a dict's keys, or a Spark Row's fields."""
    return row.keys() if isinstance(row, dict) else row.asDict()


def _groups(df: pd.DataFrame | None, key_columns: list[str]) -> dict[tuple, pd.DataFrame]:
    if df is None or df.empty:
        return {}
    return {
        tuple(_normalize(list(key))): rows.reset_index(drop=True)
        for key, rows in df.groupby(key_columns, sort=False, dropna=False)
    }


def simulate_batch(
    processor: Any,
    *,
    time_mode: str,
    key_columns: list[str],
    input_rows: pd.DataFrame | None,
    initial_state: pd.DataFrame | None = None,
    batch_timestamp_ms: int = 0,
    watermark_ms: int = 0,
    prior_state: dict[str, list[Any]] | None = None,
) -> SimulatedHandle:
    """Run ``processor`` on one batch from empty state, or from ``prior_state`` (variable or
    ``"timers"`` -> rows, see :meth:`SimulatedHandle.load`); the handle holds the state after."""
    handle = SimulatedHandle(time_mode, watermark_ms)
    mode = handle.time_mode
    timer_values = TimerValues(
        batch_timestamp_ms if mode != "none" else -1, watermark_ms if mode == "eventtime" else -1
    )
    processor.init(handle)
    for name, rows in (prior_state or {}).items():
        handle.load(name, rows)
    for key, rows in _groups(initial_state, key_columns).items():
        handle.setGroupingKey(key)
        processor.handleInitialState(key, rows, timer_values)
    for key, rows in _groups(input_rows, key_columns).items():
        handle.setGroupingKey(key)
        for _ in processor.handleInputRows(key, iter([rows]), timer_values) or ():
            pass  # output is not state; the generator must run for its state updates
    threshold = {"processingtime": batch_timestamp_ms, "eventtime": watermark_ms}.get(mode)
    if threshold is not None:  # as TwsTester fires them: per key, each timer due, then deleted
        for key in list(handle._timers.getAllKeysWithTimers()):
            for expiry in [t for t in handle._timers.listTimers(key) if t <= threshold]:
                handle.setGroupingKey(key)
                info = ExpiredTimerInfo(expiry)
                for _ in processor.handleExpiredTimer(key, timer_values, info) or ():
                    pass
                handle.deleteTimer(expiry)
    processor.close()
    return handle
