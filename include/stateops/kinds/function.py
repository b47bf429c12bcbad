"""A sink of the user's own: ``sink: {function: module:write, undo: module:undo}``.

``write(df, batch_id)`` is called with each batch (from Spark's ``foreachBatch``: ``df`` is the
batch's DataFrame, ``batch_id`` the checkpoint's batch plus the sink's ``batch_offset``); it
writes wherever it writes (a JDBC table, a key-value store, a service) and must be idempotent
by ``batch_id``: a batch that runs again after a kill is written again with the same id.

``undo(after_batch)`` removes what the batches after ``after_batch`` wrote: a rollback or a
backfill calls it, in the process that rolls back, once the checkpoint was rolled back; it must
be safe to call again (a rollback killed in it calls it again). A sink without one is refused
by every operation that must undo output, in one line, before anything changes.

Both are imported from the registry's ``code_paths`` first, as a processor is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stateops.core import faults, fence
from stateops.core.code import import_ref
from stateops.core.errors import StateOpsError
from stateops.kinds.base import Sink, register_sink

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from pyspark.sql import DataFrame

    from stateops.core.storage import S3Path

__all__ = ["FUNCTION"]


class FunctionSink:
    name = "function"
    fields = ("function", "undo")
    connector = None
    connection_type = None
    session_conf: dict[str, str] = {}
    exclusive = False  # the user's store: its own rules

    def check(self, sink: Sink) -> None:
        for field in ("function", "undo"):
            ref = getattr(sink, field)
            if ref is not None and (":" not in ref or not all(ref.split(":", 1))):
                raise ValueError(f"sink {field} {ref!r}: give it as module:function")
        if not sink.function:
            raise ValueError("a function sink names its function: module:function")

    def require(self, sink: Sink) -> None:
        return None  # nothing to ask before a run: its place is made as it writes

    def where(self, sink: Sink) -> str:
        return f"function {sink.function}"

    def places(self, sink: Sink) -> list[str]:
        return []

    def write(self, df: DataFrame, batch_id: int, sink: Sink) -> None:
        _load(sink, "function")(df, sink.folder_batch(batch_id))

    def undo_plan(self, sink: Sink, to_batch: int) -> dict[str, Any]:
        """Its ``undo`` with the last batch to keep; refused, one line, without one (or one
        that does not import)."""
        if not sink.undo:
            raise StateOpsError(
                f"sink function {sink.function} has no undo, and what the batches after "
                f"{to_batch} wrote must be removed first: write undo(after_batch) beside it "
                "and name it as the sink's undo (module:function); nothing changed"
            )
        _load(sink, "undo")  # refused now, not once the checkpoint was rolled back
        return {
            "format": sink.format,
            "undo": sink.undo,
            "after_batch": sink.folder_batch(to_batch),
            "code_paths": [str(p) for p in sink.code_paths],
        }

    def rewrites(self, sink: Sink, first_batch: int, since_ms: int | None) -> None:
        """Nothing is written twice: the undo removed it first."""
        return None

    def set_aside(
        self, plan: dict[str, Any], run_id: str, submit: Callable[[str, list[str]], None]
    ) -> None:
        """``undo(after_batch)``, in this process."""
        faults.point("undo")
        fence.guard()
        undo = import_ref(plan["undo"], "sink.undo", "the sink", plan["code_paths"])
        try:
            undo(plan["after_batch"])
        except Exception as err:  # the user's code: its failure as a line, and what follows
            raise StateOpsError(
                f"sink undo {plan['undo']}({plan['after_batch']}) failed: "
                f"{type(err).__name__}: {err}; the checkpoint is rolled back, and the rollback "
                "calls it again when it runs again"
            ) from err

    def plan_lines(self, plan: dict[str, Any]) -> list[str]:
        return [f"  sink: {plan['undo']}({plan['after_batch']}) removes the later batches' output"]

    def undo_hint(self, plan: dict[str, Any]) -> str:
        return f"what {plan['undo']} removed, from the sink's own backups"

    def touches(self, plan: dict[str, Any]) -> dict[str, list[Path | S3Path]]:
        return {"move": [], "delete": [], "write": []}  # the user's store: its own rights

    def mark(self, sink: Sink) -> None:
        return None

    def compare(
        self,
        sink: Sink,
        *,
        run_id: str,
        after_batch: int,
        key_columns: list[str],
        mark: object,
        before: dict[str, Any] | None,
    ) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
        """The sink's rows are the user's store's: not read back, not compared."""
        lines = [
            f"the batches after {after_batch} were written again through {sink.function}; "
            "its store is not read back, so rows are not compared"
        ]
        return lines, {}, {}


def _load(sink: Sink, field: str) -> Callable[..., Any]:
    ref = getattr(sink, field)
    function = import_ref(ref, f"sink.{field}", "the sink", sink.code_paths)
    if not callable(function):
        raise StateOpsError(f"sink {field} {ref!r} is not a function")
    return function


FUNCTION = register_sink(FunctionSink(), "function")
