"""The managed-query registry: one YAML file describing every streaming query.

Relative paths in the file are resolved against ``data_dir`` (itself relative to the file);
``STATEOPS_DATA_DIR`` overrides it and ``STATEOPS_REGISTRY`` names the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from stateops.core import fence
from stateops.core.errors import RegistryError, StateOpsError
from stateops.core.model import CONN_ID, DDLSchema, Model, schema_columns, schema_fields
from stateops.core.steps import OVERRIDABLE, safe_run_id
from stateops.core.storage import S3Path, location, write_file
from stateops.kinds import Sink, Source

__all__ = [
    "DEFAULT_REGISTRY",
    "LEASE_SECONDS",
    "Query",
    "Registry",
    "checkpoint_of",
    "data_path",
    "derived_registry",
    "load_registry",
    "placement",
    "registry_path",
    "schema_columns",
    "schema_fields",
    "write_partitions",
    "write_switch",
]

# Inside a --py-files zip this file's location says nothing: STATEOPS_HOME names the project.
PROJECT_ROOT = Path(os.environ.get("STATEOPS_HOME") or Path(__file__).resolve().parents[3])
DEFAULT_REGISTRY = PROJECT_ROOT / "registry.yaml"

PROVIDER_CLASSES = {
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
}

NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"
"""A query's (or a source's) name: an identifier, usable in task ids and file names."""
# A query's lease outlives its holder's last renewal by this (the registry's lease_seconds):
# Airflow's task heartbeat timeout (300 s by default), so a lost worker's lease is free by the
# time Airflow has failed its task and retries it (docs/deployment.md: how the timeouts fit).
LEASE_SECONDS = 300.0
MIN_LEASE_SECONDS = 10
_Name = Annotated[str, Field(pattern=f"^{NAME_PATTERN}$")]
# module:attribute, a class or function of the user's code.
_FUNCTION_REF = r"^[\w.]+:[A-Za-z_]\w*$"


_DURATION = r"\d+ (second|minute|hour|day)s?"
_UNITS_MS = {"second": 1_000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000}


def _duration_ms(text: str) -> int:
    number, unit = text.split()
    return int(number) * _UNITS_MS[unit.rstrip("s")]


def _timedelta(duration: str) -> timedelta:
    return timedelta(milliseconds=_duration_ms(duration))


def parse_duration(value: str, field: str) -> timedelta:
    """``value``, a duration as the registry writes them (90 minutes, 2 hours, 1 day), where
    a command line gives one (``field``: the option)."""
    try:
        return _timedelta(_as_duration(value))
    except ValueError as err:
        raise StateOpsError(f"{field}: {err}") from None


def _as_duration(value: str) -> str:
    if not re.fullmatch(_DURATION, value):
        raise ValueError(f"expected a duration (90 minutes, 2 hours, 1 day), got {value!r}")
    return value


_Duration = Annotated[str, AfterValidator(_as_duration)]
# The backup schedules whose period is known: a backup older than twice it is a finding.
_PRESET_PERIODS = {
    "@hourly": timedelta(hours=1),
    "@daily": timedelta(days=1),
    "@weekly": timedelta(weeks=1),
}
# A Kafka source's committed offset this close to the broker's earliest (a share of the
# records the partition still retains) is WARNed: retention deletes whole log segments, so
# the next one to go may well hold it. 10%: with a week's retention, less than about 17 hours
# of records to spare.
RETENTION_MARGIN = 0.10
GROWTH_WINDOW = timedelta(hours=6)
KEEP_HISTORY = timedelta(days=30)
# The readiness windows by default: an upgrade is watched, a migration not (its new query is
# the old code on another source, and a migration's dry run reads that source already).
READINESS = {"upgrade": timedelta(hours=1)}


class Health(Model):
    """The thresholds of the health rules (`stateops status`, the Streaming state view): the
    registry's top-level ``health:`` for every query, a query's own ``health:`` over it. Unset
    fields take the top level's, then the defaults (:meth:`Registry.health_limits`)."""

    input_waiting: _Duration | None = None
    """Input files landed this long ago and not read: WARN (default: twice
    ``start.schedule`` when it is a duration, else 1 hour)."""
    lag_records: int | None = Field(None, ge=0)
    """A Kafka source more than this many records behind its topics' end: FAIL (default and
    0: no limit)."""
    retention_margin: float | None = Field(None, gt=0, lt=1)
    """A Kafka source's committed offset within this share of the records a partition retains
    of the earliest retained one: WARN (default 0.1)."""
    backup_within: _Duration | None = None
    """No backup newer than this: WARN (default: twice ``backups.schedule`` when it is
    @hourly, @daily or @weekly, else no limit)."""
    failed_runs: int | None = Field(None, ge=1)
    """This many of the query's runs failed in a row: FAIL (default 1: its last run). Fewer
    are a WARN that pages no one (the next scheduled run may well succeed)."""
    state_rows_per_hour: int | None = Field(None, ge=1)
    """The query's state rows (Spark's count at the end of each run) growing faster than this
    over ``growth_window``: WARN, the leak of state that is never removed (default: no
    limit; what a healthy query may grow by is its own)."""
    state_bytes_per_hour: int | None = Field(None, ge=1)
    """The same for its state's bytes in memory, as Spark reports them (default: no limit)."""
    growth_window: _Duration | None = None
    """Over how long the state's growth is measured: from the first run in it to the last
    (default 6 hours)."""
    keep_history: _Duration | None = None
    """How long the query's figures over time are kept (`stateops status --history`, default
    30 days)."""
    upgrade_readiness: _Duration | Literal["off"] | None = None
    """After a code upgrade switched the query: how long its runs are watched. A run that
    fails (``failed_runs`` in a row) within it, or no batch committed by its end, and
    stream_health switches the query back to its old checkpoint (default 1 hour)."""
    migration_readiness: _Duration | Literal["off"] | None = None
    """The same after a migration switched the query (default off)."""


@dataclass(frozen=True)
class HealthLimits:
    """A query's health thresholds, resolved (:meth:`Registry.health_limits`)."""

    input_waiting: timedelta
    lag_records: int | None
    retention_margin: float
    backup_within: timedelta | None
    failed_runs: int = 1
    state_rows_per_hour: int | None = None
    state_bytes_per_hour: int | None = None
    growth_window: timedelta = GROWTH_WINDOW
    keep_history: timedelta = KEEP_HISTORY
    readiness: dict[str, timedelta] = field(default_factory=lambda: dict(READINESS))
    """The readiness window after a switch, by the operation that switched (none: off)."""


class Watermark(Model):
    column: str
    delay: _Duration

    @property
    def delay_ms(self) -> int:
        return _duration_ms(self.delay)


class Processor(Model):
    class_: str = Field(alias="class", pattern=_FUNCTION_REF)
    options: dict[str, str | int | float | bool] = {}
    time_mode: Literal["None", "ProcessingTime", "EventTime"] = "None"
    output_mode: Literal["Append", "Update"] = "Append"


class Transform(Model):
    """The user's own query: ``function(spark, inputs, **options)`` returns the streaming
    DataFrame the sink writes (``inputs``: each source's name -> its streaming DataFrame), with
    whatever stateful operators it applies, and its own watermarks."""

    function: str = Field(pattern=_FUNCTION_REF)
    options: dict[str, str | int | float | bool] = {}
    output_mode: Literal["append", "update", "complete"] = "append"


class InitialState(Model):
    """What ``handleInitialState`` takes, and how a state export of the query maps onto it."""

    schema_: DDLSchema = Field(alias="schema")
    unique_keys: bool = False
    """True where the processor keeps one value per key: duplicate keys are then refused."""
    from_export: dict[str, str] = {}
    """Initial-state column -> column expression over one exported variable (``variable``)."""
    position: str | None = None
    """The column that holds a row's position in its key's list (from an export:
    ``list_position``). Spark hands a key's initial rows to ``handleInitialState`` in no
    particular order, so this is how a processor restores the exported order. Files may leave
    it out: it is then null."""
    mapping: str | None = Field(None, pattern=_FUNCTION_REF)
    """``module:function(spark, old_state, **options) -> DataFrame``: the initial state from a
    state export of older code (``old_state``: each exported state variable or store by name,
    as the export wrote it), where ``from_export``'s column mapping does not suffice: a code
    upgrade (:mod:`stateops.ops.upgrade`). Its result is checked as any initial state."""
    options: dict[str, Any] = {}
    """Keyword arguments of ``mapping``."""


class Expiry(Model):
    """No expired state left behind in ``variable`` (a processor's state variable, or a
    built-in operator's store: ``default``) at the validated batch's watermark. Either from a
    session's own times: per key, the latest ``time_column`` plus the timeout (the query
    code's option ``timeout_option``, in seconds) must be after the watermark; or from the
    timeout the state records (``timeout_column``, epoch ms, such as applyInPandasWithState's
    ``value_timeoutTimestamp``): every row's must be after the watermark (a group whose
    function kept it on timeout without a new timeout holds -1)."""

    variable: str = "default"
    time_column: str | None = None
    timeout_option: str | None = None
    timeout_column: str | None = None

    @model_validator(mode="after")
    def _one_rule(self) -> Expiry:
        session = (self.time_column, self.timeout_option)
        if (None in session and session != (None, None)) or (
            (session == (None, None)) == (self.timeout_column is None)
        ):
            raise ValueError("give time_column and timeout_option, or timeout_column")
        return self


class Expectations(Model):
    """Data-level checks beyond the defaults (keys non-null; one row per key for value state)."""

    non_negative: list[str] = []
    """``variable.column`` paths (struct fields joined by ``_``) that must be >= 0."""
    expiry: Expiry | None = None
    row_change_factor: float = Field(10.0, ge=1.0)
    """Rows per variable may grow or shrink by at most this factor since the last validation."""


class Trigger(Model):
    processing_time: str = Field("10 seconds", pattern=r"^\d+ (second|minute|hour)s?$")
    """The interval of continuous runs."""
    drain_limit: str = Field("20 minutes", pattern=r"^\d+ (second|minute|hour)s?$")
    """The longest an available-now run of a clock-driven query (a processing-time timeout,
    transformWithState in ProcessingTime mode: Spark never ends those) waits for its input to
    drain; it then stops after a committed batch and says so (``drained: false``). Below
    stream_start's 30-minute interval, so such a query cannot hold back its next run."""

    @property
    def drain_limit_seconds(self) -> float:
        return _duration_ms(self.drain_limit) / 1000


class StateStore(Model):
    provider: Literal["rocksdb", "hdfs"] = "rocksdb"
    changelog_checkpointing: bool = True
    min_deltas_for_snapshot: int = Field(10, ge=1)
    min_batches_to_retain: int = Field(100, ge=1)
    encoding: Literal["unsaferow", "avro"] = "unsaferow"
    """spark.sql.streaming.stateStore.encodingFormat of a new checkpoint: ``avro`` lets Spark
    evolve a transformWithState processor's state schemas (RocksDB only)."""
    checkpoint_format: Literal[1, 2] = 1
    """spark.sql.streaming.stateStore.checkpointFormatVersion of a new checkpoint (2: what
    Spark's real-time mode needs; RocksDB only)."""

    @model_validator(mode="after")
    def _format_needs_rocksdb(self) -> StateStore:
        if self.checkpoint_format == 2 and self.provider != "rocksdb":
            # Spark 4.2: STATE_STORE_CHECKPOINT_IDS_NOT_SUPPORTED, at run time.
            raise ValueError("checkpoint_format 2 is for the rocksdb provider only")
        return self


_Memory = Annotated[str, Field(pattern=r"^\d+[kmgtKMGT]?$")]  # Spark's: 512m, 2g
_Coordinate = Annotated[str, Field(pattern=r"^[\w.\-]+:[\w.\-]+:[\w.\-]+$")]


def _schedule(value: str) -> str:
    if not re.fullmatch(rf"{_DURATION}|@\w+|\S+( \S+){{4,5}}", value):
        raise ValueError(
            "expected a duration (30 minutes, 2 hours) or a cron expression or preset "
            f"(*/30 * * * *, @hourly), got {value!r}"
        )
    return value


_Schedule = Annotated[str, AfterValidator(_schedule)]


class Schedules(Model):
    """A query's own schedules, over the registry's: its lifecycle DAGs of that kind are its
    own (``stream_start__<query>``, ...), on this schedule."""

    start: _Schedule | None = None
    """Over ``start.schedule``: its runs (DAG ``stream_start__<query>``)."""
    backup: _Schedule | None = None
    """Over ``backups.schedule``: its backups (DAG ``stream_checkpoint_backup__<query>``)."""
    cleanup: _Schedule | None = None
    """Over ``cleanup.schedule``: its cleanups (DAG ``stream_snapshot_cleanup__<query>``)."""


class Submit(Model):
    """How a query's Spark jobs are launched: ``spark-submit``'s own options, per query, as
    the provider's ``SparkSubmitOperator`` and ``stateops`` pass them
    (:func:`stateops.spark.jobs.submit_args`). Unset: the connection's and Spark's defaults."""

    conn_id: str = "spark_default"
    """The Airflow connection of type ``spark`` the DAGs submit through (its host is the
    master; its extras: deploy mode, queue, ...); the CLI takes ``--master`` instead."""
    deploy_mode: Literal["client", "cluster"] | None = None
    """``cluster`` where Spark runs a Python driver on the cluster (YARN, Kubernetes)."""
    driver_memory: _Memory | None = None
    executor_memory: _Memory | None = None
    executor_cores: int | None = Field(None, ge=1)
    num_executors: int | None = Field(None, ge=1)
    """YARN and Kubernetes."""
    total_executor_cores: int | None = Field(None, ge=1)
    """A standalone cluster."""
    queue: str | None = None
    """YARN's queue."""
    packages: list[_Coordinate] = []
    """Maven coordinates Spark resolves at launch (``--packages``)."""
    conf: dict[str, str] = {}
    """Launch-time Spark settings (``--conf``), e.g. ``spark.driver.cores`` or
    ``spark.kubernetes.namespace``; ``spark_conf`` holds the session's runtime ones."""


class Approvers(Model):
    """Who may answer a query's approvals (:mod:`stateops.control.approval`)."""

    users: list[str] = []
    """The Airflow users who may answer, by the id their auth manager gives them (the user
    name under Airflow's simple auth manager); empty: anyone allowed to act on the DAG."""
    not_the_triggerer: bool = False
    """An approval is refused to the person who triggered the run: a second person approves."""


class Query(Model):
    """One managed streaming query."""

    name: _Name
    description: str = ""
    source: Source | None = None
    """The one input of a processor query, or of a transform (named ``source`` there)."""
    sources: dict[_Name, Source] = {}
    """A transform's inputs by name, where it reads more than one."""
    watermark: Watermark | None = None
    processor: Processor | None = None
    transform: Transform | None = None
    key_columns: list[str] = []
    """A processor's grouping keys; for a transform, the keys its expectations use."""
    initial_state: InitialState | None = None
    expectations: Expectations = Expectations()
    output_schema: DDLSchema | None = None
    sink: Sink
    checkpoint: str
    trigger: Trigger = Trigger()
    state_store: StateStore = StateStore()
    shuffle_partitions: int = Field(4, ge=1)
    spark_conf: dict[str, str] = {}
    submit: Submit = Submit()
    """Its Spark jobs' launch settings (``spark-submit``'s own)."""
    schedules: Schedules = Schedules()
    """Its own start, backup and cleanup schedules, over the registry's."""
    health: Health = Health()
    """Its health rules' thresholds, over the registry's ``health:``."""
    approval: Literal["required", "none"] | None = None
    """Whether someone (its ``approvers``) approves its irreversible steps (migration, code
    upgrade, backfill, restore over its checkpoint, repartition) in Airflow first; unset: a
    migration and an upgrade ask, the others do not."""
    approvers: Approvers = Approvers()
    _code_paths: tuple[Path, ...] = PrivateAttr(default=())
    _declared: dict | None = PrivateAttr(default=None)

    @property
    def code_paths(self) -> tuple[Path, ...]:
        """Its registry's ``code_paths`` (where its ``transform.function`` or
        ``processor.class`` may live): kept by copies of the query, so whatever imports its
        code (:func:`stateops.spark.streaming.load_processor`, ...) finds it."""
        return self._code_paths

    @property
    def logic(self) -> str:
        """A digest of what a backfill may change about the query (``OVERRIDABLE``: its
        logic and checks): two runs with one digest process their input alike."""
        fields = self.model_dump(by_alias=True, include=set(OVERRIDABLE))
        text = json.dumps(fields, sort_keys=True, default=str)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def needs_approval(self, operation: str) -> bool:
        """Whether ``operation`` (stateops.control.approval.OPERATIONS) waits for an approval."""
        # Unset: the operations that switch the query to a new checkpoint ask.
        return (
            self.approval == "required" if self.approval else operation in ("migration", "upgrade")
        )

    @property
    def output_mode(self) -> str:
        """The sink's output mode, as ``writeStream.outputMode`` takes it."""
        if self.transform is not None:
            return self.transform.output_mode
        assert self.processor is not None
        return self.processor.output_mode.lower()

    @property
    def movable(self) -> bool:
        """Whether a migration may carry its state by the initialState road: a processor
        that takes carried-over state (``initial_state.from_export``); a transform (its
        built-in operators' state moves by transplant, one source at a time). The transplant
        needs neither."""
        if self.transform is not None:
            return True
        return self.initial_state is not None and bool(self.initial_state.from_export)

    @property
    def bootstrappable(self) -> bool:
        """Whether a bootstrap can start it on carried-over state: a processor with an
        ``initial_state`` section, or a transform (from a checkpoint, by transplant)."""
        return self.transform is not None or self.initial_state is not None

    @property
    def inputs(self) -> dict[str, Source]:
        """Every source by name (the one-source form's name is ``source``)."""
        return self.sources or {"source": self.source}

    def input_name(self, name: str = "") -> str:
        """The input ``name`` names (empty: the only one); an unknown or missing name is
        refused in one line that lists the query's sources."""
        names = ", ".join(self.inputs)
        if name in self.inputs or (not name and len(self.inputs) == 1):
            return name or next(iter(self.inputs))
        if not name:
            raise RegistryError(
                f"query {self.name} reads {len(self.inputs)} sources ({names}): name the one "
                "that moves"
            )
        if self.source is not None:
            names = "it reads one source: leave the source name empty"
        else:
            names = f"its sources are {names}"
        raise RegistryError(f"query {self.name} has no source {name!r}: {names}")

    def with_input(self, name: str, source: Source) -> Query:
        """The query reading ``source`` as its input ``name``, everything else as it is."""
        if self.source is not None:
            return self.model_copy(update={"source": source})
        return self.model_copy(update={"sources": {**self.sources, name: source}})

    @property
    def inputs_text(self) -> str:
        """The sources as a person reads them: ``json /landing/x``, or by name when several."""
        if self.source is not None:
            return self.source.text
        return "; ".join(f"{n}: {s.text}" for n, s in self.sources.items())

    @property
    def inputs_brief(self) -> dict[str, dict[str, Any]]:
        """Each source by name: its format and folder or topics (what status and ``queries
        --json`` show)."""
        return {n: {"format": s.format, **s.kind.brief(s)} for n, s in self.inputs.items()}

    @model_validator(mode="after")
    def _one_shape(self) -> Query:
        if (self.source is None) == (not self.sources):
            raise ValueError("give either source (one input) or sources (inputs by name)")
        if (self.processor is None) == (self.transform is None):
            raise ValueError(
                "give either processor (a transformWithStateInPandas class) or transform "
                "(a function that builds the query)"
            )
        if self.transform is not None:
            self._timeout_option_is_set()
            for field in ("watermark", "initial_state", "output_schema"):
                if getattr(self, field) is not None:
                    raise ValueError(
                        f"{field} is for processor queries: a transform applies its own "
                        "watermarks and its result has its own schema"
                    )
            return self
        if self.sources:
            raise ValueError("a processor reads one source: give source, not sources")
        if not self.key_columns:
            raise ValueError("key_columns: a processor groups by at least one key column")
        if self.output_schema is None:
            raise ValueError("output_schema: a processor declares the schema of what it emits")
        return self._processor_columns()

    @property
    def code_options(self) -> dict[str, str | int | float | bool]:
        """The options the query's own code takes (the processor's or the transform's)."""
        code = self.processor or self.transform
        assert code is not None
        return code.options

    def _timeout_option_is_set(self) -> None:
        expiry = self.expectations.expiry
        option = expiry and expiry.timeout_option
        if option and not isinstance(self.code_options.get(option), int):
            owner = "processor" if self.processor else "transform"
            raise ValueError(
                f"expectations.expiry.timeout_option {option!r} is not an integer option of "
                f"the {owner}"
            )

    def _processor_columns(self) -> Query:
        assert self.source is not None and self.processor is not None
        columns = schema_columns(self.source.schema_)
        for key in self.key_columns:
            if key not in columns:
                raise ValueError(
                    f"key column {key!r} is not in source.schema ({', '.join(columns)})"
                )
        if self.initial_state:
            state_columns = schema_columns(self.initial_state.schema_)
            for key in self.key_columns:
                if key not in state_columns:
                    raise ValueError(f"key column {key!r} is not in initial_state.schema")
            mapped = set(self.initial_state.from_export) - {"variable"}
            if self.initial_state.from_export and mapped != set(state_columns):
                raise ValueError(
                    "initial_state.from_export must map every initial_state.schema column "
                    f"({', '.join(state_columns)}) and name the exported 'variable'"
                )
            position = self.initial_state.position
            if position is not None and position not in state_columns:
                raise ValueError(f"initial_state.position {position!r} is not in its schema")
        self._timeout_option_is_set()
        if self.watermark and self.watermark.column not in columns:
            raise ValueError(f"watermark.column {self.watermark.column!r} is not in source.schema")
        if self.processor.time_mode == "EventTime" and not self.watermark:
            raise ValueError("processor.time_mode EventTime needs a watermark")
        if self.state_store.provider != "rocksdb":
            # Spark 4.2: UNSUPPORTED_FEATURE.STORE_BACKEND_NOT_SUPPORTED_FOR_TWS, at run time.
            raise ValueError(
                f"state_store.provider {self.state_store.provider!r}: transformWithState "
                "processors run only on rocksdb in Spark 4.2 (hdfs serves built-in operators)"
            )
        return self

    def spark_conf_for_query(self) -> dict[str, str]:
        """Session settings that shape this query's state; extra ``spark_conf`` wins."""
        store = self.state_store
        conf = {
            "spark.sql.shuffle.partitions": str(self.shuffle_partitions),
            "spark.sql.streaming.stateStore.providerClass": PROVIDER_CLASSES[store.provider],
            "spark.sql.streaming.stateStore.minDeltasForSnapshot": str(
                store.min_deltas_for_snapshot
            ),
            "spark.sql.streaming.minBatchesToRetain": str(store.min_batches_to_retain),
            # Always set: a shared session must not carry one query's format to the next.
            "spark.sql.streaming.stateStore.checkpointFormatVersion": str(store.checkpoint_format),
            "spark.sql.streaming.stateStore.encodingFormat": store.encoding,
        }
        if store.provider == "rocksdb":
            conf["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] = str(
                store.changelog_checkpointing
            ).lower()
        conf.update(self.spark_conf)
        return conf


def timetable(schedule: str) -> str | timedelta:
    """A registry schedule as Airflow's ``@dag(schedule=...)`` takes it."""
    return _timedelta(schedule) if re.fullmatch(_DURATION, schedule) else schedule


class Backups(Model):
    """Where scheduled backups go (``<url>/<query>``) and how many are kept."""

    url: str = Field("s3://stateops-backups", pattern=r"^s3://[^/\s]+(/\S*)?$")
    conn_id: str = "aws_default"
    schedule: str = "@daily"
    keep_last: int = Field(7, ge=1)
    max_age: str | None = Field("30d", pattern=r"^\d+[smhd]$")
    drill_schedule: _Schedule | None = "@weekly"
    """When the DAG stream_restore_drill restores each query's newest backup into a scratch
    place and reads its state (stateops.ops.drill); None: no scheduled drills."""

    def url_for(self, query: str) -> str:
        return f"{self.url.rstrip('/')}/{query}"


class Start(Model):
    """The scheduled runs of every query (DAG stream_start)."""

    schedule: _Schedule = "30 minutes"
    """Every N seconds, minutes, hours or days after the last run (the first at once when
    the DAG is unpaused), or a cron expression or preset (``@hourly``) for Airflow."""

    @property
    def timetable(self) -> str | timedelta:
        """The schedule as Airflow's ``@dag(schedule=...)`` takes it."""
        return timetable(self.schedule)


class Alerts(Model):
    """The health DAG (stream_health, docs/alerts.md): how often it checks every query, and
    the Airflow notifier a rule's change goes through (None: the task's log only)."""

    schedule: _Schedule = "5 minutes"
    notifier: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*\.[A-Za-z_]\w*$")
    """An Airflow notifier class by its import path, e.g.
    ``airflow.providers.http.notifications.HttpNotifier``."""
    notifier_args: dict[str, Any] = {}
    """Its keyword arguments; templated fields see the change as ``alert`` (``alert.text``,
    ``alert.query``, ``alert.rule``, ``alert.state``, ``alert.level``, ``alert.message``)."""


class Cleanup(Model):
    """Scheduled snapshot-group cleanup (DAG stream_snapshot_cleanup)."""

    schedule: str = "@daily"
    retain_batches: int = Field(10, ge=1)


class Connections(Model):
    """The Airflow connections a registry's operations go through, by id (docs/connections.md).
    Where tasks run they are resolved by Airflow (its secrets backend, the AWS hook's role
    assumption); the Spark jobs get what was resolved in their environment, never on their
    command line."""

    checkpoint: str | None = Field(None, pattern=CONN_ID)
    """Type aws: the S3 of the checkpoints, the S3 sinks and the control store. None: the
    deployment's ``STATEOPS_CHECKPOINT_CONN_ID``, else the environment's (``AWS_*``, the
    instance's role)."""
    kafka: str = Field("kafka_default", pattern=CONN_ID)
    """Type kafka: the brokers of each Kafka source and sink that names no ``connection``."""


class Registry(Model):
    path: Path
    data_dir: Path
    queries: dict[str, Query]
    invalid: dict[str, str] = {}
    """The entries refused, each with its one-line reason: the other queries load and run (a
    typo in one entry stops that query only); asking for one of these raises its reason."""
    code_paths: list[Path] = []
    """Folders of the users' own query code (``transform.function``, ``processor.class``):
    on ``sys.path`` in the driver, shipped to the executors."""
    start: Start = Start()
    backups: Backups = Backups()
    cleanup: Cleanup = Cleanup()
    health: Health = Health()
    alerts: Alerts = Alerts()
    connections: Connections = Connections()
    control: str | None = None
    """Where the queries' leases live when the hosts that operate them share no disk (an S3
    prefix, through the checkpoint connection); None: under ``data_dir`` (one host)."""
    lease_seconds: float = LEASE_SECONDS
    """How long a query's lease (:class:`stateops.control.lock.QueryLock`) outlives its
    holder's last renewal (renewed every third of it): how soon a host takes over the lease
    of a holder that died on another host, where its process cannot be looked at."""
    derived_from: Path | None = None
    """The user's registry a run's own registry was written from (:func:`derived_registry`):
    its entry already says where the query runs, so no switch applies to it."""

    def schedule(self, kind: str, query: Query | None = None) -> str:
        """The schedule of ``kind`` (``start``, ``backup``, ``cleanup``): ``query``'s own
        (its ``schedules``), else the registry's."""
        own = getattr(query.schedules, kind) if query is not None else None
        return (
            own
            or {
                "start": self.start.schedule,
                "backup": self.backups.schedule,
                "cleanup": self.cleanup.schedule,
            }[kind]
        )

    def health_limits(self, query: Query) -> HealthLimits:
        """``query``'s health thresholds: its own ``health:``, else the registry's, else the
        defaults (some follow the schedules: input may wait two of stream_start's runs, a
        backup two of the backup's)."""
        own, every = query.health, self.health

        def pick(field: str) -> Any:
            value = getattr(own, field)
            return value if value is not None else getattr(every, field)

        start = timetable(self.schedule("start", query))
        waiting = pick("input_waiting")
        if waiting:
            input_waiting = _timedelta(waiting)
        else:  # a cron schedule's period is not one number
            input_waiting = 2 * start if isinstance(start, timedelta) else timedelta(hours=1)
        within = pick("backup_within")
        period = _PRESET_PERIODS.get(self.schedule("backup", query))

        def readiness(operation: str) -> timedelta | None:
            window = pick(f"{operation}_readiness")
            if window == "off":
                return None
            return _timedelta(window) if window else READINESS.get(operation)

        return HealthLimits(
            input_waiting=input_waiting,
            lag_records=pick("lag_records") or None,
            retention_margin=pick("retention_margin") or RETENTION_MARGIN,
            backup_within=_timedelta(within) if within else 2 * period if period else None,
            failed_runs=pick("failed_runs") or 1,
            state_rows_per_hour=pick("state_rows_per_hour"),
            state_bytes_per_hour=pick("state_bytes_per_hour"),
            growth_window=_timedelta(w) if (w := pick("growth_window")) else GROWTH_WINDOW,
            keep_history=_timedelta(k) if (k := pick("keep_history")) else KEEP_HISTORY,
            readiness={op: w for op in ("upgrade", "migration") if (w := readiness(op))},
        )

    @property
    def state_dir(self) -> Path:
        """Where locks, stop markers and run summaries live."""
        return self.data_dir / "_stateops"

    @property
    def names(self) -> list[str]:
        """Every query the file names, its refused entries (:attr:`invalid`) last."""
        return [*self.queries, *self.invalid]

    def query(self, name: str) -> Query:
        if name in self.invalid:
            raise RegistryError(self.invalid[name])
        try:
            return self.queries[name]
        except KeyError:
            known = ", ".join(sorted(self.queries)) or "none"
            raise RegistryError(
                f"{self.path}: no query named {name!r} (registered: {known})"
            ) from None

    def owner_of(self, checkpoint: str | os.PathLike[str]) -> Query | None:
        """The registered query whose checkpoint ``checkpoint`` is, if any."""
        resolved = _normal(checkpoint)
        return next((q for q in self.queries.values() if _normal(q.checkpoint) == resolved), None)

    def control_place(self, *parts: str) -> S3Path:
        """``parts`` under the control store (the registry names one)."""
        return _control_place(self.control, *parts)

    def lock_path(self, name: str) -> Path | S3Path:
        """Where query ``name``'s lease (its lock and hold) lives: :mod:`stateops.control.lock`."""
        if self.control:
            return self.control_place(name, "lease.json")
        return self.state_dir / "locks" / f"{name}.lock"

    def stop_marker(self, name: str) -> Path | S3Path:
        """Where a stop request to query ``name``'s running query goes (beside its lease)."""
        if self.control:
            return self.control_place(name, "stop.json")
        return self.state_dir / "control" / name / "stop"

    def alerts_path(self, name: str) -> Path | S3Path:
        """The health rules query ``name`` fails, as last alerted (:mod:`stateops.alerts`):
        in the control store where the registry names one (the health DAG's task for the
        query may run on any host)."""
        if self.control:
            return self.control_place(name, "alerts.json")
        return self.state_dir / "alerts" / f"{name}.json"

    def history_path(self, name: str) -> Path | S3Path:
        """The folder of query ``name``'s figures over time, a file per day
        (:mod:`stateops.control.history`): written by its runs and its health checks, on any
        host."""
        if self.control:
            return self.control_place(name, "history")
        return self.state_dir / "history" / name

    def run_summary_path(self, name: str, run_id: str | None = None) -> Path | S3Path:
        """The summary of query ``name``'s run ``run_id`` (None: of its latest run), which the
        Spark job writes and a task on another host may read: in the control store where the
        registry names one (:func:`stateops.ops.start.write_summary`)."""
        runs = self.control_place(name, "runs") if self.control else self.state_dir / "runs" / name
        return runs / (f"{safe_run_id(run_id)}.json" if run_id else "latest.json")

    def work_path(self, name: str, operation: str, run_id: str) -> Path | S3Path:
        """The folder of run ``run_id`` of ``operation`` on query ``name``: what one step
        writes and a later one reads (a migration's export, the registry its Spark steps run
        with). In the control store where the registry names one (a later step may run on any
        host), else under ``data_dir``."""
        run = safe_run_id(run_id)
        if self.control:
            return self.control_place(name, "work", operation, run)
        return self.state_dir / operation / run

    def run_registry_path(self, name: str, operation: str, run_id: str) -> Path | S3Path:
        """Where run ``run_id`` of ``operation`` (a migration, an upgrade, a backfill with
        overrides) keeps the registry its Spark steps run with (:func:`derived_registry`)."""
        return self.work_path(name, operation, run_id) / "registry.yaml"

    def switch_path(self, name: str) -> Path | S3Path:
        """Where a migration records the query's current source and checkpoint: in the
        control store where the registry names one (every host sees it), else under
        ``data_dir``."""
        return _switch_path(self.data_dir, self.control, name)

    def switch_before(self, name: str, run_id: str) -> str | None:
        """Where run ``run_id`` keeps the switch of ``name`` it replaces (its undo puts it
        back), or None where there is no switch to replace yet."""
        switch = self.switch_path(name)
        return str(_before(switch, name, run_id)) if switch.exists() else None

    def switch_history(self, name: str) -> list[dict]:
        """What switched query ``name`` (migrations, upgrades, repartitions, their undos),
        oldest first: each a lineage record with its ``operation``, ``run_id`` and ``time``."""
        switch = _switch_record(self.switch_path(name))[0]
        return (switch or {}).get("history", [])

    def switch_note(self, name: str) -> str | None:
        """What query ``name``'s switch changes about its entry, in words with the switch's
        file (None: nothing)."""
        path = self.switch_path(name)
        switch = None if self.derived_from else _switch_record(path)[0]
        if switch is None:
            return None
        query, said = self.queries[name], []
        moved = _where(switch["current"]) != _where(switch["declared"])
        if moved and _normal(query.checkpoint) == _normal(switch["current"]["checkpoint"]):
            said.append("source and checkpoint switched by a migration or code upgrade")
        counted, said_count = switch.get("partitions"), query._declared["shuffle_partitions"]
        if counted and query.shuffle_partitions == counted["current"] != said_count:
            said.append(
                f"{counted['current']} partitions since a repartition (the entry says {said_count})"
            )
        return f"{'; '.join(said)}: {path}" if said else None

    def data_path(self, path: str) -> str:
        """``path`` as the user wrote it, under this registry's ``data_dir`` (:func:`data_path`)."""
        return data_path(self.data_dir, path)


def _normal(checkpoint: str | os.PathLike[str]) -> str:
    """One spelling per checkpoint: an absolute path, or ``s3://BUCKET/KEY`` (``s3a://`` is
    Spark's name for the same objects)."""
    text = str(checkpoint)
    if text.startswith(("s3://", "s3a://")):
        return "s3://" + text.split("://", 1)[1].strip("/")
    return str(Path(text).resolve())


def write_switch(
    registry: Registry,
    name: str,
    source: dict,
    checkpoint: str,
    lineage: dict,
    sink_batch_offset: int = 0,
    input_name: str = "source",
) -> Path:
    """Record that ``name`` now runs on ``checkpoint`` with ``source`` as its input
    ``input_name`` (a migration's switch), its output numbered from ``sink_batch_offset`` (see
    :class:`Sink`); the partition count a repartition recorded goes on applying.

    The registry file is not edited: the switch is kept beside the data with what the file
    declares now, and applies while the file still reads from there (:func:`_switched`).
    ``lineage`` is appended to the switch's history.
    """
    registry = _users_registry(registry)
    query = registry.query(name)
    moved = query.with_input(input_name, Source.model_validate(source))
    current = placement(moved) | {
        "checkpoint": _normal(checkpoint),
        "sink_batch_offset": sink_batch_offset,
    }
    return _save_switch(registry, query, current, lineage, query.shuffle_partitions)


def write_partitions(registry: Registry, name: str, count: int, lineage: dict) -> Path:
    """Record that ``name``'s state now has ``count`` partitions (a repartition, or a rollback
    to before one): the query's ``shuffle_partitions`` while the file still says the count it
    says now. Where it runs stays as it is."""
    registry = _users_registry(registry)
    query = registry.query(name)
    current = placement(query) | {
        "checkpoint": _normal(query.checkpoint),
        "sink_batch_offset": query.sink.batch_offset,
    }
    return _save_switch(registry, query, current, lineage, count)


def _users_registry(registry: Registry) -> Registry:
    """The user's registry that ``registry`` was derived from (a run's own), else itself: a
    switch is recorded against the user's entry."""
    return load_registry(registry.derived_from) if registry.derived_from else registry


def _switch_record(path: Path | S3Path) -> tuple[dict | None, str | None]:
    """The switch at ``path`` and its version in the control store (S3's ETag; None on local
    disk, where the query's lock alone keeps writers apart), or (None, None): none."""
    if isinstance(path, S3Path):
        raw, version, _ = path.read_versioned()
    else:
        try:
            raw, version = path.read_bytes(), None
        except (FileNotFoundError, NotADirectoryError):
            raw = None
    if raw is None:
        return None, None
    try:
        switch = json.loads(raw)
    except ValueError as err:
        raise RegistryError(f"{path}: unreadable migration switch ({err})") from None
    if not isinstance(switch, dict):
        raise RegistryError(f"{path}: unreadable migration switch (not a mapping)")
    return switch, version


def _save_switch(
    registry: Registry, query: Query, current: dict, lineage: dict, count: int
) -> Path:
    """The switch of ``query`` (as it runs now): ``current``, against what its entry in the
    file declares now (``declared``: edits of the entry from here on apply over ``current``),
    and its partition count ``count`` against the file's."""
    path = registry.switch_path(query.name)
    previous, version = _switch_record(path)
    previous = previous or {}
    assert query._declared is not None, "a query of a registry file"
    declared = query._declared
    switch = {"declared": declared, "current": current}
    if count != declared["shuffle_partitions"]:
        switch["partitions"] = {"declared": declared["shuffle_partitions"], "current": count}
    switch["history"] = [*previous.get("history", []), lineage]
    text = json.dumps(switch, indent=1, default=str)
    run_id = lineage.get("run_id")
    fence.guard()  # a step that lost the query's lease switches nothing
    before = _before(path, query.name, run_id) if previous and run_id else None
    if before and not before.exists():  # the switch this run replaces, for its undo
        before.write_text(json.dumps(previous, indent=1, default=str))
    if isinstance(path, S3Path):  # compare and swap: over the version read, or a first one
        if not path.write_own(text.encode("utf-8"), version):
            raise StateOpsError(
                f"{path}: the switch of {query.name} changed while this run wrote it (another "
                f"migration, upgrade or repartition of it at once?); nothing was switched: see "
                f"stateops status {query.name}, then run again"
            )
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def placement(query: Query) -> dict:
    """Where a query reads (``source`` or ``sources``) and keeps its state (``checkpoint``):
    what a migration's switch changes."""
    if query.source is not None:
        inputs = {"source": query.source.model_dump(by_alias=True)}
    else:
        inputs = {"sources": {n: s.model_dump(by_alias=True) for n, s in query.sources.items()}}
    return inputs | {"checkpoint": query.checkpoint}


def derived_registry(
    registry: Registry, name: str, changes: dict, dest: str | os.PathLike[str]
) -> Path | S3Path:
    """Write a registry holding only query ``name`` as it is now (a switch applied), with
    ``changes`` replacing fields of its entry.

    The same data folder, so the same lock, markers and run summaries as the user's registry
    (a backfill or migration step runs under the caller's lock); validated before anyone runs
    with it: an invalid change is a RegistryError and nothing is written. ``dest`` is in the
    control store where the registry names one (:meth:`Registry.run_registry_path`): the run's
    later steps read it on any host.
    """
    entry = registry.query(name).model_dump(by_alias=True, exclude={"name"}) | changes
    raw = _read_yaml(registry.path.read_text(encoding="utf-8"))
    raw.update(
        data_dir=str(registry.data_dir),
        queries={name: entry},
        code_paths=[str(p) for p in registry.code_paths],
        derived_from=str(registry.derived_from or registry.path),
    )
    text = yaml.safe_dump(raw, sort_keys=False)
    with tempfile.TemporaryDirectory() as scratch:  # validated before it is written
        check = Path(scratch) / "registry.yaml"
        check.write_text(text, encoding="utf-8")
        load_registry(check).query(name)
    path = location(dest)
    write_file(path, text)
    return path


def _before(switch: Path | S3Path, name: str, run_id: str) -> Path | S3Path:
    """Beside ``switch``: the switch run ``run_id`` replaced (read once, not looked up again)."""
    return switch.with_name(f"{name}.before-{safe_run_id(run_id)}.json")


def _control_place(control: str, *parts: str) -> S3Path:
    return location("/".join([control.rstrip("/"), *parts]))


def _switch_path(data_dir: Path, control: str | None, name: str) -> Path | S3Path:
    if control:
        return _control_place(control, name, "switch.json")
    return data_dir / "_stateops" / "switch" / f"{name}.json"


def _switched(query: Query, path: Path, switch_file: Path | S3Path) -> Query:
    """``query`` (its entry in registry file ``path``) where its switch says it runs: the
    source and checkpoint a migration or upgrade moved it to, the partition count a
    repartition gave it.

    The switch holds what the entry declared when it was written. Edits of the entry since
    then apply over the switch (an option, a schema, the trigger, ...). An entry that reads
    from where the switch moved the query adopts the switch. An entry that reads from
    anywhere else contradicts it, and is refused. A switch that moved nothing (a
    repartition's count, a migration rolled back) pins no place: only its count applies.
    """
    switch, _ = _switch_record(switch_file)
    if switch is None:
        return query
    try:
        declared, current = switch["declared"], switch["current"]
    except (KeyError, TypeError) as err:
        raise RegistryError(f"{switch_file}: unreadable migration switch ({err})") from None
    try:
        here = placement(query)
        data = query.model_dump(by_alias=True)
        if _where(current) == _where(declared):  # it moved nothing (a count, a switch undone)
            pass  # the entry's own place, wherever it is now
        elif _where(here) == _where(declared):
            for field in ("source", "sources"):
                if field in current:
                    data[field] = _merged(declared.get(field), current[field], here.get(field))
            data["checkpoint"] = str(current["checkpoint"])
            data["sink"]["batch_offset"] = int(current.get("sink_batch_offset", 0))
        elif _where(here) == _where(current):  # the entry adopted the switch
            if not query.sink.batch_offset:
                data["sink"]["batch_offset"] = int(current.get("sink_batch_offset", 0))
        else:
            raise RegistryError(
                f"{path}: queries.{query.name}: the entry reads {_where_text(here)}, but "
                f"{switch_file} runs it on {_where_text(current)} (switched from "
                f"{_where_text(declared)}): write that source and checkpoint into the entry to "
                "adopt the switch, or put back the ones it switched from and undo the switch "
                "(docs/backfill-migration.md#after-the-switch-what-the-query-runs-on)"
            )
        counted = switch.get("partitions")
        if counted and query.shuffle_partitions == counted["declared"]:
            data["shuffle_partitions"] = int(counted["current"])
        return Query.model_validate(data)
    except (ValidationError, KeyError, TypeError) as err:
        raise RegistryError(f"{switch_file}: invalid migration switch ({err})") from None


_WHERE = ("format", "path", "topic", "topics", "bootstrap_servers")


def _inputs(placed: dict) -> dict[str, dict]:
    return {"source": placed["source"]} if placed.get("source") else placed.get("sources", {})


def _where(placed: dict) -> dict:
    """Where a placement (:func:`placement`) reads and keeps its state: each input's format,
    folder or topics and brokers, and the checkpoint (not its options or schema)."""
    return {
        "checkpoint": _normal(placed["checkpoint"]),
        **{n: {k: s.get(k) or None for k in _WHERE} for n, s in _inputs(placed).items()},
    }


def _where_text(placed: dict) -> str:
    reads = (Source.model_validate(s).text for s in _inputs(placed).values())
    return f"{'; '.join(reads)} on {placed['checkpoint']}"


_UNSET = object()


def _merged(base: Any, ours: Any, theirs: Any) -> Any:
    """``ours`` (the switch's) with what ``theirs`` (the entry now) changed since ``base``
    (the entry when the switch was written): key by key, into nested mappings."""
    if not (isinstance(base, dict) and isinstance(ours, dict) and isinstance(theirs, dict)):
        return ours if theirs == base else theirs
    out = dict(ours)
    for key in base.keys() | theirs.keys():
        was, now = base.get(key, _UNSET), theirs.get(key, _UNSET)
        if was == now:
            continue
        if now is _UNSET:
            out.pop(key, None)
        elif key in out and was is not _UNSET:
            out[key] = _merged(was, out[key], now)
        else:
            out[key] = now
    return out


def _read_yaml(text: str) -> object:
    """``text`` read by libyaml's safe loader where PyYAML has it (every DAG file reads the
    registry at parse time: benchmarks/bench_dag_parse.py); a text it refuses is read again by
    the pure-Python loader, whose error names the character or alias at fault."""
    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        try:
            return yaml.load(text, Loader=fast)
        except yaml.YAMLError:
            pass
    return yaml.safe_load(text)


def registry_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The registry file: ``path``, else ``STATEOPS_REGISTRY``, else the project's. A run's
    own registry in the control store (``s3://...``: :func:`derived_registry`) is read into a
    local copy, which is what this returns."""
    given = str(path or os.environ.get("STATEOPS_REGISTRY") or DEFAULT_REGISTRY)
    if given.startswith(("s3://", "s3a://")):
        return _fetched(location(given))
    return Path(given).resolve()


def _fetched(place: S3Path) -> Path:
    """A local copy of the registry object at ``place``, rewritten whole at each reading."""
    try:
        text = place.read_text()
    except FileNotFoundError:
        raise RegistryError(
            f"{place}: no such registry (a run's own registry is written by its plan step)"
        ) from None
    digest = hashlib.sha256(str(place).encode()).hexdigest()[:16]
    copy = Path(tempfile.gettempdir()) / "stateops-registries" / f"{digest}.yaml"
    copy.parent.mkdir(parents=True, exist_ok=True)
    tmp = copy.with_name(f"{copy.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, copy)
    return copy


def load_registry(path: str | os.PathLike[str] | None = None, *, switched: bool = True) -> Registry:
    """Read and validate the registry; errors name the bad field. Each query is where its
    switch says it runs (:func:`_switched`); ``switched=False`` reads no switch, for a DAG
    file's parse, which needs only the names and shapes of the queries (a switch changes
    neither) and must not call the control store (benchmarks/bench_dag_parse.py)."""
    path = registry_path(path)
    try:
        raw = _read_yaml(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise RegistryError(f"{path}: cannot read registry ({err.strerror})") from err
    except yaml.YAMLError as err:
        raise RegistryError(_yaml_error(path, err)) from err
    if not isinstance(raw, dict) or not isinstance(raw.get("queries"), dict):
        raise RegistryError(f"{path}: expected a mapping with a 'queries' mapping")
    known = {
        *("data_dir", "code_paths", "queries", "start", "backups", "cleanup", "health", "alerts"),
        *("control", "connections"),
        *("derived_from", "lease_seconds"),
    }
    unknown = set(raw) - known
    if not isinstance(raw.get("derived_from", ""), str):
        raise RegistryError(f"{path}: derived_from: the registry file a run's own was written from")
    if unknown:
        raise RegistryError(f"{path}: unknown top-level field(s): {', '.join(sorted(unknown))}")
    raw_data_dir = raw.get("data_dir", "data")
    if not isinstance(raw_data_dir, str):
        raise RegistryError(f"{path}: data_dir: expected a folder path, got {raw_data_dir!r}")
    data_dir = Path(os.environ.get("STATEOPS_DATA_DIR") or path.parent / raw_data_dir)
    data_dir = data_dir.resolve()
    control = raw.get("control")
    if control is not None and not re.fullmatch(r"s3://[^/]+(/.*)?", str(control)):
        raise RegistryError(
            f"{path}: control: expected s3://BUCKET/PREFIX (where the leases of hosts that "
            f"share no disk live), got {control!r}; leave it out on one host"
        )
    lease_seconds = raw.get("lease_seconds", LEASE_SECONDS)
    number = isinstance(lease_seconds, int | float) and not isinstance(lease_seconds, bool)
    if not number or not MIN_LEASE_SECONDS <= lease_seconds <= 86400:
        raise RegistryError(
            f"{path}: lease_seconds: expected seconds from {MIN_LEASE_SECONDS} to 86400 (how "
            f"long a lease outlives its holder's last renewal), got {raw['lease_seconds']!r}"
        )
    sections = _sections(path, raw)
    switched = switched and not raw.get("derived_from")  # a run's own: its entry says where
    queries, invalid = {}, {}
    kafka = sections["connections"].kafka
    for name, spec in raw["queries"].items():
        try:  # one entry refused: its query alone cannot run
            switch = _switch_path(data_dir, control, str(name)) if switched else None
            queries[name] = _entry(path, data_dir, name, spec, switch, kafka)
        except RegistryError as err:
            invalid[str(name)] = str(err)
    _refuse_shared_sinks(queries, invalid)
    code_paths = _code_paths(path, raw.get("code_paths"))
    for query in queries.values():
        query._code_paths = query.sink._code_paths = tuple(code_paths)
    return Registry(
        path=path,
        data_dir=data_dir,
        queries=queries,
        invalid=invalid,
        code_paths=code_paths,
        control=control,
        lease_seconds=lease_seconds,
        derived_from=raw.get("derived_from"),
        **sections,
    )


def _refuse_shared_sinks(queries: dict[str, Query], invalid: dict[str, str]) -> None:
    """Two queries writing one place of a sink kind that is one query's alone (a folder, a
    Delta table): each is refused (moved to ``invalid``), naming the other."""
    writers: dict[str, list[str]] = {}
    for name, query in queries.items():
        if query.sink.kind.exclusive:
            for place in query.sink.kind.places(query.sink):
                writers.setdefault(str(place).rstrip("/"), []).append(name)
    for place, names in writers.items():
        if len(names) < 2:
            continue
        for name in names:
            others = ", ".join(n for n in names if n != name)
            invalid[name] = (
                f"query {name}: its {queries[name].sink.format} sink {place} is also written by "
                f"{others}: a sink's place is one query's to write (its batches, its rollbacks); "
                "give each query its own"
            )
    for name in invalid:
        queries.pop(name, None)


def _sections(path: Path, raw: dict) -> dict[str, Any]:
    """The registry's top-level sections that concern every query, validated (a wrong one
    refuses the whole file)."""
    sections = {}
    models = {
        "start": Start,
        "backups": Backups,
        "cleanup": Cleanup,
        "health": Health,
        "alerts": Alerts,
        "connections": Connections,
    }
    for section, model in models.items():
        try:
            sections[section] = model.model_validate(raw.get(section) or {})
        except ValidationError as err:
            first = err.errors()[0]
            field_path = ".".join(str(p) for p in first["loc"])
            message = str(first["msg"]).removeprefix("Value error, ")
            raise RegistryError(f"{path}: {section}.{field_path}: {message}") from None
    return sections


def _entry(
    path: Path,
    data_dir: Path,
    name: str,
    spec: object,
    switch: Path | S3Path | None,
    kafka: str = Connections().kafka,
) -> Query:
    """Query ``name`` of registry file ``path`` (its entry ``spec``), validated, its paths
    resolved and its Kafka sources and sink given a connection (default: ``kafka``), where its
    switch (at ``switch``; None: none applies) says it runs."""
    if not isinstance(spec, dict):
        raise RegistryError(f"{path}: queries.{name}: expected a mapping")
    if "name" in spec:
        raise RegistryError(f"{path}: queries.{name}.name: a query's name is its key; remove it")
    try:
        query = Query.model_validate({"name": name, **spec})
    except ValidationError as err:
        first = err.errors()[0]
        field_path = ".".join(str(p).removesuffix("_") for p in (name, *first["loc"]))
        message = str(first["msg"]).removeprefix("Value error, ")
        raise RegistryError(f"{path}: queries.{field_path}: {message}") from None
    resolved = _connected(_resolve_paths(query, data_dir), kafka)
    entry = resolved if switch is None else _connected(_switched(resolved, path, switch), kafka)
    entry._declared = placement(resolved) | {"shuffle_partitions": resolved.shuffle_partitions}
    return entry


def _code_paths(path: Path, raw: object) -> list[Path]:
    """``code_paths``: folders relative to the registry file, each of which must exist."""
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
        raise RegistryError(f"{path}: code_paths: expected a list of folders, got {raw!r}")
    folders = [(path.parent / p).resolve() for p in raw]
    for raw_path, folder in zip(raw, folders, strict=True):
        if not folder.is_dir():
            raise RegistryError(
                f"{path}: code_paths: {raw_path!r} is not a folder ({folder}); paths are "
                "relative to the registry file"
            )
    return folders


def use_connections(registry_file: str | os.PathLike[str] | None) -> None:
    """The connections of the registry at ``registry_file`` made this process's: its
    ``connections.checkpoint`` (:func:`stateops.core.s3.use_checkpoint_connection`); a Kafka
    source or sink names its own. A registry that cannot be read changes nothing: the
    command's own reading of it says what is wrong."""
    from stateops.core.s3 import use_checkpoint_connection

    try:
        registry = load_registry(registry_file, switched=False)
    except StateOpsError:
        return
    use_checkpoint_connection(registry.connections.checkpoint)


def checkpoint_of(
    target: str, registry_file: str | os.PathLike[str] | None = None
) -> tuple[str, Registry | None, Query | None]:
    """The one rule for "a checkpoint path or a registered query's name": ``target`` is a path
    if it exists or has a ``/`` in it, else a query's name. Returns (checkpoint path, the
    registry or None where a path's registry cannot be read, the query that owns it or None).
    """
    if Path(target).exists() or "/" in target:
        try:
            registry = load_registry(registry_file)
        except RegistryError:
            return target, None, None
        return target, registry, registry.owner_of(target)
    registry = load_registry(registry_file)
    query = registry.query(target)
    return query.checkpoint, registry, query


def _yaml_error(path: Path, err: yaml.YAMLError) -> str:
    """``FILE:LINE:COLUMN: not valid YAML: PROBLEM (CONTEXT at line N); fix ...`` on one line:
    PyYAML's own text spans several lines with a caret under the fault."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
    context, context_mark = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context and context_mark and (not mark or context_mark.line != mark.line):
        context = f"{context} at line {context_mark.line + 1}"
    what = f"{problem} ({context})" if context else problem
    line = f"line {mark.line + 1}" if mark else "the file"
    return " ".join(f"{where}: not valid YAML: {what}; fix {line} of the registry".split())


def data_path(data_dir: Path, path: str) -> str:
    """The one rule for a path the user wrote: a URL (``s3a://b/x``) as it is, else relative to
    the registry's ``data_dir`` (an absolute path stays itself), resolved."""
    return path if "://" in path else str((data_dir / path).resolve())


def _resolve_paths(query: Query, data_dir: Path) -> Query:
    def absolute(p: str) -> str:
        return data_path(data_dir, p) if p else p  # no path: a Kafka source or sink

    def located(source: Source | None) -> Source | None:
        return source and source.model_copy(update={"path": absolute(source.path)})

    return query.model_copy(
        update={
            "checkpoint": absolute(query.checkpoint),
            "source": located(query.source),
            "sources": {name: located(s) for name, s in query.sources.items()},
            "sink": query.sink.model_copy(update={"path": absolute(query.sink.path)}),
        }
    )


def _connected(query: Query, kafka: str) -> Query:
    """``query`` with each source and sink whose kind reads through a Kafka connection given
    one: its own, else ``kafka`` (the registry's ``connections.kafka``)."""

    def given(place: Any) -> Any:
        if place is None or place.kind.connection_type != "kafka" or place.connection:
            return place
        return place.model_copy(update={"connection": kafka})

    return query.model_copy(
        update={
            "source": given(query.source),
            "sources": {name: given(s) for name, s in query.sources.items()},
            "sink": given(query.sink),
        }
    )
