"""The CLI's grammar (issue 20, item 6): a version, global options in any position, ``--json``
on the read commands, and no traceback when the reader of its output goes away."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from stateops import __version__
from stateops.cli import _commands, build_parser
from stateops.control.lock import QueryLock
from stateops.core.registry import load_registry
from tests.conftest import VENV_BIN, cli_table, run_cli, write_registry

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
    free = json.loads(run_cli("lock", "show", "page_visits", "--json", "--registry", path,
                              check=True).stdout)  # fmt: skip
    assert free == {"query": "page_visits", "state": None, "lock": None}
    registry = load_registry(path)
    with QueryLock(registry.lock_path("page_visits"), "page_visits", "cleanup", "run-1"):
        held = json.loads(run_cli("--registry", path, "lock", "show", "page_visits", "--json",
                                  check=True).stdout)  # fmt: skip
    assert held["state"] == "held" and held["lock"]["run_id"] == "run-1"
    assert held["lock"]["operation"] == "cleanup"


def test_a_reader_that_goes_away_gets_no_traceback(tmp_path):
    """``stateops queries --json | head -c 0``: the pipe's reader is gone before the first
    write. Exit 141, as a shell reports a writer that SIGPIPE ended, and nothing on stderr."""
    path = str(write_registry(tmp_path))
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([str(VENV_BIN / "stateops"), "--registry", path, "queries",
                               "--json"], stdout=write, stderr=subprocess.PIPE, text=True,
                              timeout=60)  # fmt: skip
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_the_readme_table_lists_every_command_as_the_parser_has_it():
    """README "Every CLI command": one row per command, its `--json` and `--dry-run` columns
    and the options its synopsis shows as the parser has them; the walk with a real
    checkpoint is tests/spark/test_backup.py."""
    rows = cli_table()
    commands = {k: {o for a in p._actions for o in a.option_strings}
                for k, p in _commands(build_parser()).items()}  # fmt: skip
    assert sorted(r.command for r in rows) == sorted(commands)
    for row in rows:
        options = commands[row.command]
        assert (row.json == "yes") == ("--json" in options), row.command
        assert row.dry_run == ("--dry-run" in options), row.command
        shown = {w.strip("[]") for w in row.words if w.lstrip("[").startswith("--")}
        assert shown <= options, (row.command, shown - options)
        assert {0, 2} <= row.exit_codes and (not row.spark or 1 in row.exit_codes), row.command
