"""The Spark jobs' one main, their refusals that need no Spark, run before ``spark-submit``
starts a JVM, and the ``spark-submit`` command that runs a job.

Each job in ``stateops/jobs/`` defines ``parse_args(argv)``, ``preflight(args)`` (its
:class:`Job`'s, from :mod:`stateops.ops.jobs`) and ``main(argv)`` (:func:`job_main`): its
``main()`` runs the preflight first (a job may be submitted by hand), and the CLI and the
Airflow operator run the very same two on the arguments they are about to submit, so a bad
path, registry, batch or output folder is refused in a second instead of after 10-15 s of JVM
start-up, and the checks cannot drift apart from the job's own.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
from argparse import Namespace
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from stateops.core.errors import StateOpsError, domain_errors, one_line
from stateops.core.registry import PROJECT_ROOT, Submit, use_connections
from stateops.core.storage import in_s3

__all__ = [
    "CHECKPOINT_JAR",
    "PY_FILES",
    "Job",
    "job_main",
    "job_path",
    "job_submit",
    "load_job",
    "preflight_job",
    "py_files",
    "quiesce",
    "require_s3_jars",
    "run_local_job",
    "require_spark_s3",
    "spark_classpath_conf",
    "spark_s3_locations",
    "spark_jars",
    "spark_submit_command",
    "spark_submit_env",
    "submit_args",
]

# The library as the Spark executors get it (``--py-files``): a checkout's, built by ``make``
# (else :func:`py_files` zips the package where it is installed).
PY_FILES = PROJECT_ROOT / "build" / "stateops.zip"
# What Spark needs beyond PySpark's own jars (Spark's Kafka connector), as `make jars` fetched
# them from maven/spark/pom.xml.
SPARK_JARS = PROJECT_ROOT / "build" / "jars" / "spark"
# Spark on S3: Hadoop's S3A connector, the AWS SDK bundle (about 700 MB) and the abortable
# checkpoint file manager, as `make jars` fetched them from maven/s3/pom.xml.
S3_JARS = PROJECT_ROOT / "build" / "jars" / "s3"
# The project's own jar (the S3 checkpoint file manager): package data of an installed wheel
# (``make wheel`` puts it there), else where ``make jars`` compiles it, among the S3 jars.
_PACKAGED_JAR = Path(__file__).resolve().parents[1] / "jars" / "stateops-checkpoint.jar"
CHECKPOINT_JAR = _PACKAGED_JAR if _PACKAGED_JAR.exists() else S3_JARS / "stateops-checkpoint.jar"


@dataclass(frozen=True)
class Job:
    """What a Spark job does with its parsed arguments: ``preflight(args)``, every refusal that
    needs no Spark (what it returns is ``run``'s second argument); ``run(args, prepared)``,
    the work; ``report(args, result)`` prints the result and gives the exit code."""

    preflight: Callable[[Namespace], Any]
    run: Callable[[Namespace, Any], Any]
    report: Callable[[Namespace, Any], int]


def job_main(
    job: Job, parse_args: Callable[[list[str]], Namespace], argv: Sequence[str] | None
) -> int:
    """A Spark job's ``main``: ``argv`` (default: the command line's) parsed, then the job's
    preflight and run; bad input from either is one line ``error: ...`` on stderr and exit
    code 2, else the report's exit code."""
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    use_connections(getattr(args, "registry", None))
    try:
        with domain_errors():
            require_spark_s3(spark_s3_locations(args), Path(sys.argv[0]).name or "the job")
            result = job.run(args, job.preflight(args))
    except StateOpsError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    finally:
        _quiesce_active_session()
    return job.report(args, result)


def _quiesce_active_session() -> None:
    """The job's state stores unloaded before its process ends (:func:`quiesce`), if it
    started Spark at all."""
    if "pyspark" not in sys.modules:
        return
    from py4j.protocol import Py4JError
    from pyspark.sql import SparkSession

    try:
        spark = SparkSession.getActiveSession()
        if spark is not None:
            quiesce(spark)
    except Py4JError:
        pass  # the JVM is gone (the job's error says why): no stores left to unload


def quiesce(spark: Any) -> None:
    """Unload this JVM's state stores and wait for their maintenance to finish.

    A stopped query's stores stay loaded, and their maintenance thread goes on uploading
    snapshots into the checkpoint. At the end of a job it races with the JVM's shutdown (seen:
    "SparkEnv not active, cannot do maintenance on StateStores", RocksDB's "MANIFEST" errors
    on close, an empty file in a RocksDB zip); in a session that lives on (the tests'), a copy
    or listing taken later races with it. The next query loads its stores and restarts
    maintenance. Only this JVM's: an executor on a cluster node ends its own at its shutdown.
    """
    jvm = spark._jvm
    store = (
        jvm.java.lang.Class.forName("org.apache.spark.sql.execution.streaming.state.StateStore$")
        .getField("MODULE$")
        .get(None)
    )  # the Scala object: its package-private methods too
    # First let running maintenance finish without holding the providers' lock (work in
    # flight needs it to unload: StateStore.stop() alone waits on it for minutes), then unload.
    store.stopMaintenanceTaskWithoutLock()
    store.stop()


def job_path(job: str) -> Path:
    """The file of Spark job ``job`` (``run_query.py``, ...): in the package's ``jobs/``,
    wherever the package is (a checkout's ``include/``, an installed wheel)."""
    return Path(__file__).resolve().parent.parent / "jobs" / job


def load_job(path: str | os.PathLike[str]) -> ModuleType:
    """The job file at ``path`` as a module (imported once per process). Job files import
    PySpark only inside ``main()``, so this costs no JVM."""
    path = Path(path)
    name = f"stateops_job_{path.stem}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise StateOpsError(f"{path}: not a Spark job of the project")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return module


def preflight_job(path: str | os.PathLike[str], argv: Sequence[str]) -> None:
    """Run the job's ``preflight`` on ``argv`` (its command-line arguments); raises the
    job's one-line :class:`StateOpsError` on bad input. A job without one passes."""
    job = load_job(path)
    if not hasattr(job, "preflight"):
        return
    try:
        args = job.parse_args([str(a) for a in argv])
    except SystemExit:  # argparse printed why; the arguments are the caller's bug
        raise StateOpsError(
            f"{Path(path).name}: arguments it does not take: {' '.join(map(str, argv))}"
        ) from None
    require_spark_s3(spark_s3_locations(args), Path(path).name)
    job.preflight(args)


def job_submit(path: str | os.PathLike[str], argv: Sequence[str]) -> Submit:
    """The launch settings (``submit``) of the query a job's arguments name (``--query``, or
    a ``--checkpoint`` that is a registered query's name) in the registry they name; Spark's
    and the connection's defaults where they name none (a checkpoint by its path). The
    arguments have passed the job's preflight (:func:`preflight_job`)."""
    from stateops.core.registry import Submit, load_registry

    args = load_job(path).parse_args([str(a) for a in argv])
    name = getattr(args, "query", None) or getattr(args, "checkpoint", None)
    # no switch to read: a switch moves a query's source and checkpoint, not its launch
    query = load_registry(getattr(args, "registry", None), switched=False).queries.get(name)
    return query.submit if query is not None else Submit()


# A query's launch settings (``submit``): spark-submit's option for each, and the Spark setting
# it becomes (what Spark reports back).
_SUBMIT_FIELDS = {
    "deploy_mode": ("--deploy-mode", "spark.submit.deployMode"),
    "driver_memory": ("--driver-memory", "spark.driver.memory"),
    "executor_memory": ("--executor-memory", "spark.executor.memory"),
    "executor_cores": ("--executor-cores", "spark.executor.cores"),
    "num_executors": ("--num-executors", "spark.executor.instances"),
    "total_executor_cores": ("--total-executor-cores", "spark.cores.max"),
    "queue": ("--queue", "spark.yarn.queue"),
    "packages": ("--packages", "spark.jars.packages"),
}


def submit_args(submit: Submit) -> list[str]:
    """``spark-submit``'s own options for ``submit`` (the CLI's launch; the Airflow operator
    takes the same settings as its arguments: stateops_airflow.tasks)."""
    given = []
    for field, (flag, _) in _SUBMIT_FIELDS.items():
        value = getattr(submit, field)
        value = ",".join(value) or None if field == "packages" else value
        if value is not None:
            given += [flag, str(value)]
    return given + [arg for k, v in submit.conf.items() for arg in ("--conf", f"{k}={v}")]


def launched_with(spark: Any, submit: Submit) -> dict[str, str]:
    """What Spark itself says this run was launched with: its master, and its own value of
    each setting a query's ``submit`` can set (the keys of ``submit.conf`` too), where it has
    one: a run's summary shows the compute it really had."""
    context = spark.sparkContext
    conf = context.getConf()
    keys = [spark_key for _, spark_key in _SUBMIT_FIELDS.values()] + list(submit.conf)
    return {"spark.master": context.master} | {k: conf.get(k) for k in keys if conf.contains(k)}


def spark_jars() -> list[str]:
    """The jars every Spark session of the project gets (``--jars`` / ``spark.jars``): Spark's
    Kafka connector and what it needs (the S3 jars: :func:`spark_classpath_conf`), or none
    before ``make jars`` fetched them (a query that reads or writes Kafka is then refused by
    :func:`stateops.spark.streaming.check_code`)."""
    return sorted(str(jar) for jar in SPARK_JARS.glob("*.jar"))


def spark_classpath_conf() -> dict[str, str]:
    """Spark's S3 jars (:data:`S3_JARS`) and the project's jar (:data:`CHECKPOINT_JAR`) on the
    driver's and executors' class path, or nothing before ``make jars`` fetched them and
    without a packaged jar (a job on ``s3a://`` is then refused in one line). A class path,
    not ``--jars``: Spark copies every ``--jars`` file into each application's work folder
    (700 MB a job here); a class path entry is read in place, on the driver's machine and, on
    a cluster, on each worker, where the same folder must exist. An installed package with no
    ``make jars`` of its own takes the S3 connector from the cluster (or a query's
    ``submit.packages``)."""
    entries = [str(S3_JARS / "*")] if any(S3_JARS.glob("*.jar")) else []
    if CHECKPOINT_JAR.exists() and CHECKPOINT_JAR.parent != S3_JARS:
        entries.append(str(CHECKPOINT_JAR))
    if not entries:
        return {}
    path = os.pathsep.join(entries)
    return {"spark.driver.extraClassPath": path, "spark.executor.extraClassPath": path}


def py_files() -> str:
    """The library as the executors get it (``--py-files``): a checkout's
    ``build/stateops.zip`` (:data:`PY_FILES`, built by ``make``), else a zip of the package
    where it is installed, made once per content in the user's cache folder."""
    return str(PY_FILES) if PY_FILES.exists() else _package_zip()


@functools.cache
def _package_zip() -> str:
    import hashlib
    import zipfile

    package = Path(__file__).resolve().parents[1]
    files = sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.relative_to(package).as_posix().encode())
        digest.update(file.read_bytes())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stateops"
    made = cache / f"stateops-{digest.hexdigest()[:16]}.zip"
    if not made.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = made.with_name(f"{made.name}.{os.getpid()}.tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
            for file in files:
                archive.write(file, Path("stateops") / file.relative_to(package))
        os.replace(tmp, made)
    return str(made)


def spark_submit_command(
    job: str, master: str, args: Sequence[str], submit: Sequence[str] = ()
) -> list[str]:
    """``spark-submit`` of ``stateops/jobs/<job>`` with ``args`` (and ``submit``, more options of
    spark-submit's own): this interpreter's own (the venv's), run in :func:`spark_submit_env`.
    The one builder of the project's spark-submit commands (the CLI, the tests, a standalone
    cluster's; the Airflow operator passes the same jars)."""
    jars = spark_jars()
    classpath = [f"{key}={value}" for key, value in spark_classpath_conf().items()]
    return [
        str(Path(sys.executable).with_name("spark-submit")),
        "--master",
        master,
        "--conf",
        "spark.ui.enabled=false",
        *(["--jars", ",".join(jars)] if jars else []),
        *(arg for conf in classpath for arg in ("--conf", conf)),
        *map(str, submit),
        str(job_path(job)),
        *map(str, args),
    ]


def run_local_job(job: str, args: list[str]) -> None:
    """Run Spark job ``job`` (``stateops/jobs/<job>``) with ``args`` on this host, in a local
    Spark (a rollback's sink undo: small, and where the rollback runs); raises its one line
    (``error: ...``, else its last line) if it fails."""
    import subprocess

    preflight_job(job_path(job), args)
    cmd = spark_submit_command(job, "local[*]", args)
    done = subprocess.run(cmd, capture_output=True, text=True, env=spark_submit_env())
    if done.returncode:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        said = [line for line in lines if line.startswith("error: ")]
        why = said[-1].removeprefix("error: ") if said else (lines[-1] if lines else "no output")
        raise StateOpsError(f"{job} failed (exit {done.returncode}): {why}")


def spark_submit_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) with the Spark of this interpreter where it names
    none: ``SPARK_HOME`` the installed ``pyspark`` package, ``PYSPARK_PYTHON`` this
    interpreter, ``SPARK_CONF_DIR`` the project's ``conf/`` (as ``scripts/env.sh`` sets them).

    Without them, pip's ``spark-submit`` looks for its home with the first ``python3`` on the
    PATH: outside the venv that one has no pyspark, and the job fails with ``/bin/spark-class:
    No such file or directory``; the job's Python would not be the venv's either.
    """
    env = dict(os.environ if environ is None else environ)
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise StateOpsError(
            f"pyspark is not installed for {sys.executable}: run the project's "
            ".venv/bin/stateops (`make test` or `make demo` creates it)"
        )
    env.setdefault("SPARK_HOME", spec.submodule_search_locations[0])
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    if (PROJECT_ROOT / "conf").is_dir():
        env.setdefault("SPARK_CONF_DIR", str(PROJECT_ROOT / "conf"))
    return env


def spark_s3_locations(args: Namespace) -> list[str]:
    """The S3 locations a job's parsed arguments name: the checkpoint and sink of ``--query``
    (and, for a bootstrap, its registry's control store: it exports a checkpoint into its
    run's work folder there), the checkpoint of ``--checkpoint`` (a path or a query's name),
    ``--out`` and ``--initial-state``. A name that does not resolve is left to the job's own
    preflight, which says why."""
    from stateops.core.registry import checkpoint_of, load_registry

    registry = getattr(args, "registry", None)
    found: list[str] = []
    with contextlib.suppress(StateOpsError):
        if name := getattr(args, "query", None):
            loaded = load_registry(registry)
            query = loaded.query(name)
            found += [query.checkpoint, query.sink.path or ""]
            if getattr(args, "initial_state", None):
                found.append(loaded.control or "")
    with contextlib.suppress(StateOpsError):
        if target := getattr(args, "checkpoint", None):
            found.append(checkpoint_of(target, registry)[0])
    found += [str(getattr(args, attr, None) or "") for attr in ("out", "initial_state")]
    return sorted({str(f) for f in found if in_s3(f)})


def require_s3_jars(locations: Sequence[str], what: str) -> None:
    """Refuse, in one line, ``what`` on ``locations`` that are in S3 when Spark's S3 connector
    was not fetched (build/jars/s3 empty) and no packaged jar says the package was installed
    (where the cluster brings the connector: :func:`spark_classpath_conf`)."""
    there = [str(p) for p in locations if in_s3(p)]
    if there and not spark_classpath_conf():
        raise StateOpsError(
            f"{what}: {there[0]} is in S3, and Spark's S3 connector (hadoop-aws) is not in "
            f"{S3_JARS}: run `make jars` (it fetches it with mvn)"
        )


def require_spark_s3(locations: Sequence[str], what: str) -> None:
    """Refuse, before Spark starts, a job on ``locations`` in S3 that Spark could not reach:
    its S3 connector not fetched (build/jars/s3), or the endpoint refusing the settings Spark
    gets (a wrong key, a missing bucket) or not answering. One list request per bucket, with
    the library's own client of those settings (:func:`stateops.core.s3.checkpoint_settings`,
    which :func:`stateops.spark.streaming.use_s3` gives Spark), at once: a wrong secret fails
    here in a second, where S3A would retry for minutes inside the job. Never says a key."""
    if not locations:
        return
    require_s3_jars(locations, what)
    from stateops.core.errors import s3_error
    from stateops.core.s3 import checkpoint_settings, parse_s3_url, s3_client

    settings = checkpoint_settings()
    client = s3_client(settings, retries=0)
    endpoint = "AWS" if not settings.endpoint_url else _host(settings.endpoint_url)
    asked = set()
    for url in locations:
        where = parse_s3_url("s3://" + url.split("://", 1)[1])
        if where.bucket in asked:
            continue
        asked.add(where.bucket)
        try:
            client.list_objects_v2(Bucket=where.bucket, Prefix=where.prefix, MaxKeys=1)
        except Exception as err:
            from botocore.exceptions import BotoCoreError, ClientError

            if not isinstance(err, BotoCoreError | ClientError):
                raise
            raise s3_error(err, f"list of {where} at {endpoint}, as Spark would") from None


def _host(url: str) -> str:
    """``scheme://host:port`` of an endpoint URL: never a user or password written into it."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}"
