"""The package's face and its layers: what ``from stateops import ...`` offers, and the rule
that each layer imports only the layers below it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import stateops

pytestmark = pytest.mark.unit

PACKAGE = Path(stateops.__file__).parent
LAYERS = ["core", "control", "spark", "ops", "dev"]  # bottom up; status and cli on top


def test_every_name_of_the_face_resolves_to_its_home():
    for name in stateops.__all__:
        value = getattr(stateops, name)
        assert value.__name__ == name, name
        assert value.__module__.startswith("stateops."), name


def test_importing_the_package_loads_no_module_of_it():
    code = "import sys, stateops; print(sorted(m for m in sys.modules if m.startswith('stateops')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['stateops']"


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {n.split(".")[1] for n in names if n.startswith("stateops.")}


def test_each_layer_imports_only_the_layers_below_it():
    wrong = []
    for rank, layer in enumerate(LAYERS):
        allowed = set(LAYERS[: rank + 1])
        if layer == "dev":
            allowed = {"core", "dev"}
        for path in sorted((PACKAGE / layer).glob("*.py")):
            wrong += [f"{path.relative_to(PACKAGE)} imports stateops.{name}"
                      for name in sorted(_imported(path) - allowed)]  # fmt: skip
    assert wrong == []
