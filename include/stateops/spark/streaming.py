"""Build and run a registered query with Spark. Spark-side: PySpark is imported lazily."""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import inspect
import io
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateops.core.code import import_ref, on_sys_path
from stateops.core.errors import RegistryError
from stateops.core.registry import Query, Registry, Source
from stateops.core.storage import S3Path, spark_url
from stateops.kinds import SINK_KINDS, SOURCE_KINDS
from stateops.kinds.kafka import MALFORMED_METRIC

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = [
    "apply_query_conf",
    "build_session",
    "check_code",
    "checkpoint_url",
    "data_url",
    "use_s3",
    "clock_driven",
    "connectors",
    "load_function",
    "load_processor",
    "load_transform",
    "query_frame",
    "read_source",
    "progress_summary",
    "spark_session",
    "start_query",
    "use_code_paths",
    "write_batch",
    "fenced",
    "writing",
]

# Keep every progress event of a run: the run summary counts batches and input rows from them.
_SESSION_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.numRecentProgressUpdates": "1000000",
    "spark.ui.showConsoleProgress": "false",
}


def spark_session(app_name: str, master: str | None = None) -> SparkSession:
    """The session every job uses (UTC, no console progress bars, all progress kept), with
    the settings the kinds' connectors on Spark's path take as it starts (Delta's SQL
    extension and catalog: :func:`connector_conf`)."""
    from pyspark.sql import SparkSession

    from stateops.spark.jobs import spark_classpath_conf, spark_jars

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    if spark_jars():  # the same as spark-submit's --jars; what a session in plain Python gets
        builder = builder.config("spark.jars", ",".join(spark_jars()))
    conf = {**spark_classpath_conf(), **_SESSION_CONF, **connector_conf(spark_jars())}
    for key, value in conf.items():  # the S3 jars, the kinds' connectors
        builder = builder.config(key, value)
    return builder.getOrCreate()


def connector_conf(jars: Sequence[str]) -> dict[str, str]:
    """The start-time settings of each kind whose connector is among ``jars``."""
    kinds = {*SOURCE_KINDS.values(), *SINK_KINDS.values()}
    conf: dict[str, str] = {}
    for kind in sorted(kinds, key=lambda k: k.name):
        if kind.connector and any(kind.connector in jar for jar in jars):
            conf.update(kind.session_conf)
    return conf


# S3 has no rename: Spark's default checkpoint file manager commits each log file by one (a
# copy and a delete on S3A, where a reader may see neither). The project's writes each file with
# a single PUT at close, a log file only where none exists (If-None-Match: a second driver on
# the checkpoint fails), and fails the write when the upload fails; Spark's abortable manager,
# which does the rest, logs and swallows both (spark_jobs/java/stateops/, compiled into
# build/jars/s3 by `make jars`). It refuses a file system without conditional create, so it is
# set for an s3a:// checkpoint only.
CHECKPOINT_FILE_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
S3_FILE_MANAGER = "stateops.ConditionalCheckpointFileManager"
# Its lease fence (stateops.control.markers.write_holder): the holder object, this driver's token.
FENCE_HOLDER, FENCE_TOKEN = "stateops.fence.holder", "stateops.fence.token"


@contextlib.contextmanager
def fenced_logs(spark: SparkSession, holder: Path | S3Path, token: str) -> Iterator[None]:
    """While in it, the queries ``spark`` starts have their S3 checkpoint file manager refuse
    each log file (offsets, commits, a source's log) while ``holder`` (the checkpoint's holder
    record) names another token than ``token``, this driver's lease's: Spark's own writes
    fenced at the write. Set for the run's queries only (a one-process run's next step, under
    another lease, must not inherit it). A local checkpoint (one host: Spark's own manager)
    has no such fence."""
    if not isinstance(holder, S3Path):
        yield
        return
    spark.conf.set(FENCE_HOLDER, spark_url(holder))
    spark.conf.set(FENCE_TOKEN, token)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):  # a session already gone keeps nothing
            spark.conf.unset(FENCE_HOLDER)
            spark.conf.unset(FENCE_TOKEN)


def use_s3(spark: SparkSession) -> None:
    """Spark's S3A settings on ``spark`` from the settings the library reads checkpoints with
    (:func:`stateops.core.s3.checkpoint_settings`: the connection, else the environment), so
    Spark reads and writes s3a:// where the library does. Session settings: Hadoop's
    configuration of each read and write takes them, and they are never on a command line.
    S3A keeps one file system per bucket in a process: the first settings a bucket was used
    with stay its settings there."""
    from stateops.core.s3 import checkpoint_settings, spark_s3_conf

    for key, value in spark_s3_conf(checkpoint_settings()).items():
        spark.conf.set(key.removeprefix("spark.hadoop."), value)


def data_url(spark: SparkSession, path: str | os.PathLike[str] | S3Path) -> str:
    """How Spark names ``path``, a folder or file of data (an export, an initial state), with
    ``spark`` set to reach it where it is in S3 (:func:`use_s3`)."""
    url = spark_url(path)
    if url.startswith("s3a://"):
        use_s3(spark)
    return url


def checkpoint_url(spark: SparkSession, checkpoint: str | os.PathLike[str]) -> str:
    """How Spark names ``checkpoint`` (``s3a://`` for S3), with ``spark`` set for it: on S3 the
    S3 settings (:func:`use_s3`) and the project's S3 checkpoint file manager, elsewhere Spark's
    default manager. Call it before Spark reads or writes a checkpoint."""
    url = data_url(spark, checkpoint)
    if url.startswith("s3a://"):
        spark.conf.set(CHECKPOINT_FILE_MANAGER, S3_FILE_MANAGER)
    else:
        spark.conf.unset(CHECKPOINT_FILE_MANAGER)
    return url


def build_session(query: Query, app_name: str, master: str | None = None) -> SparkSession:
    """:func:`spark_session` with the state-shaping settings of ``query``."""
    spark = spark_session(app_name, master)
    apply_query_conf(spark, query)
    return spark


def apply_query_conf(spark: SparkSession, query: Query) -> None:
    """Set the state-shaping settings of ``query`` (they are recorded in its offset log)."""
    for key, value in {**_SESSION_CONF, **query.spark_conf_for_query()}.items():
        if key != "spark.ui.showConsoleProgress":
            spark.conf.set(key, value)


def use_code_paths(registry: Registry, spark: SparkSession | None = None) -> None:
    """The registry's ``code_paths`` on ``sys.path`` here (the driver), and with ``spark``,
    each shipped to the executors as a zip (Python workers import the user's functions that
    Spark pickles by reference, such as an ``applyInPandasWithState`` function)."""
    on_sys_path(registry.code_paths)
    if spark is None or not registry.code_paths:
        return
    # The Python workers Spark starts on the driver (transformWithState runs a processor's
    # init there) import from the folders themselves: addPyFile reaches executors only.
    env = spark.sparkContext.environment
    paths = [str(f) for f in registry.code_paths] + env.get("PYTHONPATH", "").split(os.pathsep)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
    shipped = Path(tempfile.mkdtemp(prefix="stateops-code-"))
    atexit.register(shutil.rmtree, shipped, True)  # served to executors until the driver ends
    for n, folder in enumerate(registry.code_paths):
        spark.sparkContext.addPyFile(str(_zipped(folder, shipped, f"code{n}-{folder.name}")))


def _zipped(folder: Path, into: Path, stem: str) -> Path:
    """``folder``'s files (bytecode caches left out) as ``into/STEM-HASH.zip``, named by what
    it holds: Spark refuses a second file of the same name with other bytes, as when a session
    ships code again after a file in the folder changed."""
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.rglob("*")):
            if "__pycache__" in path.parts:
                continue
            name = path.relative_to(folder).as_posix()  # dated 1980 (ZipInfo's default)
            if path.is_dir():  # zipimport finds a package without __init__.py by its entry
                archive.writestr(zipfile.ZipInfo(f"{name}/"), b"")
            elif path.is_file():
                archive.writestr(zipfile.ZipInfo(name), path.read_bytes(), zipfile.ZIP_DEFLATED)
    zipped = into / f"{stem}-{hashlib.sha256(data.getvalue()).hexdigest()[:12]}.zip"
    zipped.write_bytes(data.getvalue())
    return zipped


def _imported(query: Query, field: str, ref: str) -> Any:
    """``module:attribute`` named by the query's registry ``field``, imported from its
    registry's ``code_paths`` first (:func:`stateops.core.code.import_ref`)."""
    return import_ref(ref, field, f"query {query.name}", query.code_paths)


def load_function(query: Query, field: str, ref: str) -> Callable[..., Any]:
    """A function of the user's code named by the registry's ``field`` (``module:function``)."""
    function = _imported(query, field, ref)
    if not callable(function):
        raise RegistryError(f"query {query.name}: {field} {ref!r} is not a function")
    return function


def load_processor(query: Query) -> Any:
    assert query.processor is not None
    cls = _imported(query, "processor.class", query.processor.class_)
    try:
        return cls(**query.processor.options)
    except (TypeError, ValueError) as err:
        raise RegistryError(
            f"query {query.name}: processor.options do not fit {query.processor.class_}: {err}"
        ) from err


def load_transform(query: Query) -> Callable[..., Any]:
    """The query's ``transform.function``, checked to take ``(spark, inputs, **options)``."""
    assert query.transform is not None
    ref = query.transform.function
    function = _imported(query, "transform.function", ref)
    try:
        inspect.signature(function).bind(None, {}, **query.transform.options)
    except TypeError as err:
        raise RegistryError(
            f"query {query.name}: transform.options do not fit {ref}(spark, inputs, **options): "
            f"{err}"
        ) from None
    except ValueError:  # no signature to read (a builtin): the call will tell
        pass
    return function


def connectors(query: Query) -> set[str]:
    """The jars (by a part of their names) Spark needs for the query's sources and sink."""
    jars = {jar for source in query.inputs.values() for jar in source.kind.jars(source)}
    return jars | ({query.sink.kind.connector} if query.sink.kind.connector else set())


def check_code(query: Query) -> None:
    """The query's own code imports and takes its options, and Spark has the connectors it
    needs: checked without Spark, before a job starts."""
    from stateops.spark.jobs import SPARK_JARS, require_s3_jars, spark_jars

    for connector in sorted(connectors(query)):
        if not any(connector in jar for jar in spark_jars()):
            raise RegistryError(
                f"query {query.name} needs Spark's {connector} connector, and it is not in "
                f"{SPARK_JARS}: run `make jars` (it fetches it with mvn)"
            )
    require_s3_jars([query.checkpoint, *query.sink.kind.places(query.sink)], f"query {query.name}")
    if query.transform is not None:
        load_transform(query)
    else:
        load_processor(query)


def read_source(spark: SparkSession, source: Source) -> DataFrame:
    """A source as a streaming DataFrame of the columns of its schema, its options applied (its
    kind's reader, :mod:`stateops.kinds`)."""
    return source.kind.stream(spark, source)


def _transformed(spark: SparkSession, query: Query) -> DataFrame:
    from pyspark.sql import DataFrame

    assert query.transform is not None
    inputs = {name: read_source(spark, source) for name, source in query.inputs.items()}
    out = load_transform(query)(spark, inputs, **query.transform.options)
    if not isinstance(out, DataFrame) or not out.isStreaming:
        what = "a batch DataFrame" if isinstance(out, DataFrame) else type(out).__name__
        raise RegistryError(
            f"query {query.name}: transform.function {query.transform.function} returned "
            f"{what}, not a streaming DataFrame; build its result from the inputs it is given"
        )
    return out


def query_frame(
    spark: SparkSession, query: Query, initial_state: DataFrame | None = None
) -> DataFrame:
    """What the query's sink writes: the transform's result, or the processor's output."""
    if query.transform is not None:
        return _transformed(spark, query)
    assert query.source is not None and query.processor is not None
    df = read_source(spark, query.source)
    if query.watermark:
        df = df.withWatermark(query.watermark.column, query.watermark.delay)
    grouped_initial = (
        initial_state.groupBy(*query.key_columns) if initial_state is not None else None
    )
    return df.groupBy(*query.key_columns).transformWithStateInPandas(
        statefulProcessor=load_processor(query),
        outputStructType=query.output_schema,
        outputMode=query.processor.output_mode,
        timeMode=query.processor.time_mode,
        initialState=grouped_initial,
    )


# Queries whose foreachBatch function runs now, in this driver (Spark calls it from its stream
# thread through py4j): a stop should not land there (stateops.ops.start.await_drained).
_WRITING: set[str] = set()


# The check of each running query's lease (:func:`fenced`), by query name: called before a
# batch writes anything and again after its sink's write.
_FENCES: dict[str, Callable[[], None]] = {}


@contextlib.contextmanager
def fenced(name: str, check: Callable[[], None]) -> Iterator[None]:
    """While this lasts, every batch of query ``name`` in this driver calls ``check`` before it
    writes state or output (the stateful operators run inside the sink's write) and after
    that write, and fails when it raises: a run whose lease was taken over writes nothing
    more, and a batch whose lease was lost while it wrote is not committed."""
    _FENCES[name] = check
    try:
        yield
    finally:
        _FENCES.pop(name, None)


def write_batch(df: DataFrame, batch_id: int, query: Query) -> None:
    """Batch ``batch_id`` written by the sink's kind (:mod:`stateops.kinds`: how a batch that
    runs again is written, exactly once or at least once, is the kind's).

    The run's lease is checked (:func:`fenced`) before the write and again after it: a batch
    whose lease was lost while it wrote fails before Spark commits it, and whoever holds the
    lease now finds it uncommitted (its folder is replaced when it runs again)."""
    fence = _FENCES.get(query.name, lambda: None)
    fence()
    _WRITING.add(query.name)
    try:
        query.sink.kind.write(df, batch_id, query.sink)
        fence()
    finally:
        _WRITING.discard(query.name)


def writing(query: Query) -> bool:
    """Whether the query's foreachBatch function runs now in this driver."""
    return query.name in _WRITING


# Logical plan nodes whose batches the clock drives, and what makes them so (Spark 4.2, seen in
# analyzed plans): group state with a processing-time timeout, from applyInPandasWithState
# (FlatMapGroupsInPandasWithState) or Scala's mapGroupsWithState (FlatMapGroupsWithState), and
# transformWithState in ProcessingTime time mode (TransformWithStateInPySpark for the pandas and
# Row processors, TransformWithState for Scala's). Spark runs a no-data batch after every batch
# for these, so an available-now trigger never ends (shared/FACTS.md).
_CLOCK_NODES = {
    "FlatMapGroupsInPandasWithState": ("timeout", "ProcessingTimeTimeout"),
    "FlatMapGroupsWithState": ("timeout", "ProcessingTimeTimeout"),
    "TransformWithStateInPySpark": ("timeMode", "ProcessingTime"),
    "TransformWithState": ("timeMode", "ProcessingTime"),
}
_CLOCK_WHAT = {
    "timeout": "group state with a processing-time timeout",
    "timeMode": "transformWithState in ProcessingTime time mode",
}


def clock_driven(frame: DataFrame) -> str | None:
    """What in ``frame``'s plan makes the clock drive its batches (None: nothing does)."""
    stack = [frame._jdf.queryExecution().analyzed()]
    while stack:
        node = stack.pop()
        field, clock = _CLOCK_NODES.get(node.nodeName(), (None, None))
        if field and getattr(node, field)().toString() == clock:
            return f"{_CLOCK_WHAT[field]} ({node.nodeName()} {clock})"
        children = node.children()
        stack += [children.apply(i) for i in range(children.size())]
    return None


def start_query(
    spark: SparkSession,
    query: Query,
    *,
    available_now: bool,
    initial_state: DataFrame | None = None,
    frame: DataFrame | None = None,
    processing_time: str | None = None,
) -> StreamingQuery:
    """Start ``query`` (its :func:`query_frame`, or ``frame`` when already built) with an
    available-now trigger, or on a processing-time trigger (the query's own, or
    ``processing_time``)."""
    location = checkpoint_url(spark, query.checkpoint)
    for place in query.sink.kind.places(query.sink):  # Spark set to reach a sink in S3
        data_url(spark, place)
    out = frame if frame is not None else query_frame(spark, query, initial_state)
    writer = (
        out.writeStream.queryName(query.name)
        .outputMode(query.output_mode)
        .option("checkpointLocation", location)
        .foreachBatch(lambda batch_df, batch_id: write_batch(batch_df, batch_id, query))
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=processing_time or query.trigger.processing_time)
    return writer.start()


def progress_summary(progress: list[Any]) -> dict[str, Any]:
    """Input rows, the batches' mean duration and state rows per operator from a run's
    progress events.

    Batch counts come from the checkpoint instead: an idle trigger also reports a progress
    event, with the next batch id, though it commits nothing.
    """
    events = [json.loads(p.json) if hasattr(p, "json") else dict(p) for p in progress]
    # A no-data batch (watermark advance) can report no operators: take the last that did.
    last_state = next(
        (e["stateOperators"] for e in reversed(events) if e.get("stateOperators")), []
    )
    read = [
        e["durationMs"]["triggerExecution"]
        for e in events
        if e.get("numInputRows") and "triggerExecution" in e.get("durationMs", {})
    ]
    observed = [e.get("observedMetrics") or {} for e in events]
    return {
        "input_rows": sum(int(e.get("numInputRows", 0)) for e in events),
        # the JSON values of malformed: count sources that did not parse, skipped
        "malformed_records": sum(
            int((row or {}).get("records", 0))
            for o in observed
            for name, row in o.items()
            if name.startswith(MALFORMED_METRIC)
        ),
        # the mean time of the batches that read input (idle triggers take next to none)
        "batch_seconds": round(sum(read) / len(read) / 1000, 2) if read else None,
        "state_operators": [
            {
                "operator": i,
                "operator_name": s.get("operatorName"),
                "state_rows": s.get("numRowsTotal"),
                "memory_used_bytes": s.get("memoryUsedBytes"),
            }
            for i, s in enumerate(last_state)
        ],
    }
