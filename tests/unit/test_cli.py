"""The CLI's grammar (issue 20, item 6): a version, global options in any position, ``--json``
on the read commands, and no traceback when the reader of its output goes away."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from stateops import __version__
from stateops.cli import _commands, build_parser
from stateops.control.lock import QueryLock
from stateops.core.registry import load_registry
from stateops.spark.jobs import job_path, spark_jars, spark_submit_command, spark_submit_env
from tests.conftest import ROOT, VENV_BIN, cli_table, run_cli, write_registry

pytestmark = pytest.mark.unit


def test_version():
    proc = run_cli("--version", check=True)
    assert proc.stdout.strip() == f"stateops {__version__}"


def test_the_registry_option_goes_before_or_after_the_command(tmp_path):
    path = str(write_registry(tmp_path))
    before = run_cli("--registry", path, "queries", "--json", check=True).stdout
    after = run_cli("queries", "--json", "--registry", path, check=True).stdout
    assert before == after
    listed = json.loads(after)
    assert listed["registry"] == path
    names = [q["name"] for q in listed["queries"]]
    assert names == list(load_registry(path).queries)
    visits = next(q for q in listed["queries"] if q["name"] == "page_visits")
    assert (visits["provider"], visits["partitions"], visits["switch"]) == ("rocksdb", 2, None)


def test_lock_show_as_json_free_then_held(tmp_path):
    path = str(write_registry(tmp_path))
    free = json.loads(
        run_cli("lock", "show", "page_visits", "--json", "--registry", path, check=True).stdout
    )
    assert free == {"query": "page_visits", "state": None, "lock": None}
    registry = load_registry(path)
    with QueryLock(registry.lock_path("page_visits"), "page_visits", "cleanup", "run-1"):
        held = json.loads(
            run_cli("--registry", path, "lock", "show", "page_visits", "--json", check=True).stdout
        )
    assert held["state"] == "held" and held["lock"]["run_id"] == "run-1"
    assert held["lock"]["operation"] == "cleanup"


def test_a_reader_that_goes_away_gets_no_traceback(tmp_path):
    """``stateops queries --json | head -c 0``: the pipe's reader is gone before the first
    write. Exit 141, as a shell reports a writer that SIGPIPE ended, and nothing on stderr."""
    path = str(write_registry(tmp_path))
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [str(VENV_BIN / "stateops"), "--registry", path, "queries", "--json"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_the_cli_table_lists_every_command_as_the_parser_has_it():
    """docs/cli.md "Every CLI command": one row per command, its `--json` and `--dry-run` columns
    and the options its synopsis shows as the parser has them; the walk with a real
    checkpoint is tests/spark/test_backup.py."""
    rows = cli_table()
    commands = {
        k: {o for a in p._actions for o in a.option_strings}
        for k, p in _commands(build_parser()).items()
    }
    assert sorted(r.command for r in rows) == sorted(commands)
    for row in rows:
        options = commands[row.command]
        assert (row.json == "yes") == ("--json" in options), row.command
        assert row.dry_run == ("--dry-run" in options), row.command
        shown = {w.strip("[]") for w in row.words if w.lstrip("[").startswith("--")}
        assert shown <= options, (row.command, shown - options)
        assert {0, 2} <= row.exit_codes and (not row.spark or 1 in row.exit_codes), row.command


def test_queries_imports_each_querys_code_and_binds_its_options_as_run_does(tmp_path):
    """``stateops queries`` validates the registry (issue 40): a missing module, a missing
    function and options that do not fit are refused as ``run`` refuses them, one line each,
    exit 2; the listing is still printed."""
    counts = "stateops.pipelines.page_counts:build"
    path = write_registry(
        tmp_path,
        page_counts={"transform": {"function": "no_such_module:build"}},
        idle_sessions={
            "transform": {"function": "stateops.pipelines.idle_sessions:no_such_function"}
        },
        page_visits={
            "processor": {
                "class": "stateops.pipelines.page_visits:PageVisitsProcessor",
                "options": {"max_page": 10},
            }
        },
    )
    raw = yaml.safe_load(path.read_text())
    raw["queries"]["page_counts_too"] = {  # a transform's options, bound to its signature
        **raw["queries"]["page_counts"],
        "checkpoint": "checkpoints/page_counts_too",
        "sink": {"format": "parquet", "path": "output/page_counts_too"},
        "transform": {"function": counts, "options": {"window": "1 hour", "windows": "1"}},
    }
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    expected = [
        (
            "error: query page_visits: processor.options do not fit "
            "stateops.pipelines.page_visits:PageVisitsProcessor: ",
            "max_page",
        ),
        (
            "error: query page_counts: transform.function 'no_such_module:build' cannot be "
            "imported (No module named 'no_such_module'); is its folder in the registry's "
            "code_paths?",
            "",
        ),
        (  # a misspelt name in a module that imports: the name is wrong, not code_paths
            "error: query idle_sessions: transform.function "
            "'stateops.pipelines.idle_sessions:no_such_function': ",
            "has no 'no_such_function' (it defines: build, visit_row, visits); check the name",
        ),
        (
            "error: query page_counts_too: transform.options do not fit "
            f"{counts}(spark, inputs, **options): ",
            "windows",
        ),
    ]
    for json_flag in ([], ["--json"]):
        proc = run_cli("--registry", str(path), "queries", *json_flag)
        assert proc.returncode == 2, proc
        lines = proc.stderr.splitlines()
        assert len(lines) == len(expected), lines
        for line, (start, word) in zip(lines, expected, strict=True):
            assert line.startswith(start) and word in line, (line, start)
    listed = json.loads(proc.stdout)["queries"]
    assert {q["name"]: q["error"] is None for q in listed} == {
        "user_sessions": True,
        "page_visits": False,
        "page_counts": False,
        "idle_sessions": False,
        "page_counts_too": False,
    }
    fine = run_cli("--registry", str(write_registry(tmp_path / "fine")), "queries")
    assert (fine.returncode, fine.stderr) == (0, ""), fine


def test_a_spark_command_finds_the_venvs_spark_without_env_sh(tmp_path):
    """``.venv/bin/stateops run`` in a shell that did not source scripts/env.sh (issue 40): pip's
    spark-submit looked for its home with the system python3 and failed with
    ``/bin/spark-class: No such file or directory``. A stand-in for ``java`` records how
    spark-class starts Spark's launcher, and ends there: no JVM starts."""
    import importlib.util

    path = write_registry(tmp_path)
    record = tmp_path / "java.args"
    standin = tmp_path / "bin"
    standin.mkdir()
    # Its empty line starts the command spark-class would run, and its exit code ends that.
    (standin / "java").write_text(
        f'#!/bin/sh\n{{ printf "%s\\n" "$@"; echo "PYSPARK_PYTHON=$PYSPARK_PYTHON"; }} > {record}'
        "\necho\nexit 3\n"
    )
    (standin / "java").chmod(0o755)
    clean = {
        "PATH": f"{standin}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    proc = subprocess.run(
        [str(VENV_BIN / "stateops"), "--registry", str(path), "run", "page_visits"],
        capture_output=True,
        text=True,
        env=clean,
        timeout=120,
    )
    assert "spark-class: No such file" not in proc.stderr, proc.stderr
    assert proc.returncode == 3 and record.exists(), proc  # the stand-in's exit code
    args = record.read_text().splitlines()
    pyspark = Path(importlib.util.find_spec("pyspark").submodule_search_locations[0])
    jars = args[args.index("-cp") + 1]
    assert jars.endswith("/jars/*") and Path(jars[:-7]).resolve() == pyspark.resolve(), args
    assert args[args.index("-cp") + 2 :][:2] == [
        "org.apache.spark.launcher.Main",
        "org.apache.spark.deploy.SparkSubmit",
    ], args
    assert str(job_path("run_query.py")) in args, args
    python = Path(args[-1].removeprefix("PYSPARK_PYTHON="))
    assert (python.name, python.parent.resolve()) == ("python", VENV_BIN.resolve()), args


def test_the_spark_submit_environment_keeps_what_the_caller_set():
    """The Spark of this interpreter only where the environment names none."""
    import importlib.util
    import sys

    pyspark = importlib.util.find_spec("pyspark").submodule_search_locations[0]
    assert spark_submit_env({"PATH": "/bin"}) == {
        "PATH": "/bin",
        "SPARK_HOME": pyspark,
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_CONF_DIR": str(ROOT / "conf"),
    }
    theirs = {
        "SPARK_HOME": "/opt/spark",
        "PYSPARK_PYTHON": "/usr/bin/python3",
        "SPARK_CONF_DIR": "/etc/spark",
    }
    assert spark_submit_env(theirs) == theirs
    assert spark_submit_command("run_query.py", "local[2]", ["--query", "q"]) == [
        str(Path(sys.executable).with_name("spark-submit")),
        "--master",
        "local[2]",
        "--conf",
        "spark.ui.enabled=false",
        "--jars",
        ",".join(spark_jars()),
        # the S3 jars on the class path, read in place (not copied per job as --jars are)
        "--conf",
        f"spark.driver.extraClassPath={ROOT / 'build' / 'jars' / 's3' / '*'}",
        "--conf",
        f"spark.executor.extraClassPath={ROOT / 'build' / 'jars' / 's3' / '*'}",
        str(job_path("run_query.py")),
        "--query",
        "q",
    ]
    # make jars fetched Spark's Kafka connector; Spark gets it, and nothing PySpark ships
    jars = {Path(jar).name.rsplit("-", 1)[0] for jar in spark_jars()}
    assert {"spark-sql-kafka-0-10_2.13", "kafka-clients", "commons-pool2"} <= jars
    assert not jars & {"scala-library", "slf4j-api", "hadoop-client-api", "lz4-java"}


def test_a_job_template_leaves_out_the_optional_flags_not_given():
    """Every job's arguments come from core/steps.py: a flag and its field alone is optional
    (None or False: left out; True: the flag alone)."""
    from stateops.core.steps import EXPORT, RUN, VALIDATE, fill

    assert fill(EXPORT, {"checkpoint": "/c", "out": "/o", "batch": None}) == (
        "export_state.py",
        "old",
        ["--checkpoint", "/c", "--out", "/o"],
    )
    assert fill(EXPORT, {"checkpoint": "/c", "out": "/o", "batch": 3})[2][-2:] == ["--batch", "3"]
    assert fill(VALIDATE, {"query": "q", "json": True})[2] == ["--query", "q", "--json"]
    assert fill(VALIDATE, {"query": "q", "json": False})[2] == ["--query", "q"]
    run = fill(RUN, {"query": "q", "mode": "continuous", "run_id": "{{ run_id }}"})[2]
    assert run == ["--query", "q", "--mode", "continuous", "--run-id", "{{ run_id }}"]


def test_generate_for_a_registry_without_the_sample_queries_says_where_to_write(tmp_path):
    """A user's own registry names none of the sample datasets: ``generate`` wrote nothing and
    exited 0 (seen in the issue 40 trial); it now refuses in one line naming --out."""
    path = tmp_path / "registry.yaml"
    path.write_text(yaml.safe_dump({"data_dir": "data", "queries": {}}), encoding="utf-8")
    proc = run_cli("--registry", str(path), "generate")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "give --out FOLDER" in proc.stderr, proc.stderr
    assert not (tmp_path / "data").exists()
    written = run_cli(
        "--registry",
        str(path),
        "generate",
        "--files",
        "1",
        "--out",
        str(tmp_path / "landing"),
        check=True,
    )
    assert sorted(p.name for p in (tmp_path / "landing").iterdir()) == sorted(
        line.split(":")[0] for line in written.stdout.splitlines()
    )


def test_a_failed_operation_exits_1_and_a_refusal_2(monkeypatch, capsys):
    """The exit codes of docs/cli.md: 1 when the operation failed after its plan held (a Spark job,
    a proof: :class:`OperationFailed`), 2 for a refusal; one line on stderr either way."""
    from stateops import cli
    from stateops.core.errors import OperationFailed, StateOpsError

    for error, code in (
        (OperationFailed("the backfill of q failed"), 1),
        (StateOpsError("to_batch: 9 is not a committed batch"), 2),
    ):

        def command(args, error=error):
            raise error

        monkeypatch.setattr(cli, "cmd_queries", command)
        assert cli.main(["queries"]) == code
        assert capsys.readouterr().err == f"error: {error}\n"


@pytest.mark.parametrize(
    "command", [("backups", "list"), ("backups", "prune", "--keep-last", "1"), ("restore",)]
)
def test_a_mistyped_backup_url_is_refused_as_a_url_not_looked_up_as_a_query(tmp_path, command):
    """Found by a bad-input trial: `backups list s3:/bucket/x` said no query was named so."""
    registry = str(write_registry(tmp_path))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    refused = run_cli("--registry", registry, *command[:2], "s3:/backups/page_visits", *command[2:])
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "error: s3:/backups/page_visits: not an S3 URL (its scheme is not written s3://); "
        "use s3://BUCKET/PREFIX"
    ]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
