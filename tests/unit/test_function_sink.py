"""A sink of the user's own, without Spark: its function and undo imported from the
registry's code_paths; a rollback's plan calls undo with the last batch to keep (plus the
sink's batch_offset), and a sink without an undo, or with one that does not import, is refused
in one line before anything changes (the Spark run: tests/spark/test_function_sink.py)."""

from __future__ import annotations

import pytest

from stateops.core.errors import RegistryError, StateOpsError
from stateops.kinds import Sink
from stateops.ops.rollback import set_aside

pytestmark = pytest.mark.unit


@pytest.fixture
def code(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "calls_sink.py").write_text(
        "CALLS = []\n"
        "def write(df, batch_id):\n    CALLS.append(('write', batch_id))\n"
        "def undo(after_batch):\n    CALLS.append(('undo', after_batch))\n"
    )
    return tmp_path / "code"


def _sink(code, **fields) -> Sink:
    sink = Sink.model_validate(fields)
    sink._code_paths = (code,)  # as the registry sets them (core/registry.py)
    return sink


def test_undo_is_called_with_the_last_batch_to_keep(code):
    sink = _sink(code, function="calls_sink:write", undo="calls_sink:undo", batch_offset=10)
    assert sink.format == "function" and sink.where == "function calls_sink:write"
    plan = sink.kind.undo_plan(sink, 4)
    assert sink.kind.plan_lines(plan) == [
        "  sink: calls_sink:undo(14) removes the later batches' output"
    ]
    set_aside(plan, "rollback-1")
    import calls_sink

    assert calls_sink.CALLS == [("undo", 14)]
    sink.kind.write(None, 5, sink)
    assert calls_sink.CALLS[-1] == ("write", 15)


def test_a_sink_without_an_undo_or_with_one_that_does_not_import_is_refused(code):
    sink = _sink(code, function="calls_sink:write")
    with pytest.raises(StateOpsError, match=r"^sink function calls_sink:write has no undo, ") as e:
        sink.kind.undo_plan(sink, 4)
    assert "\n" not in str(e.value) and str(e.value).endswith("nothing changed")
    sink = _sink(code, function="calls_sink:write", undo="calls_sink:undoo")
    with pytest.raises(RegistryError, match=r"sink.undo 'calls_sink:undoo': .* has no 'undoo'"):
        sink.kind.undo_plan(sink, 4)


def test_a_function_is_given_as_module_colon_function():
    with pytest.raises(ValueError, match="sink function 'calls_sink.write': give it as module"):
        Sink.model_validate({"function": "calls_sink.write"})
    with pytest.raises(ValueError, match="undo is for function sinks, not for a parquet one"):
        Sink.model_validate({"format": "parquet", "path": "out", "undo": "m:u"})
