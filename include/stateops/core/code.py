"""The user's own code, named in the registry as ``module:attribute`` (a processor, a
transform, a sink's function), imported from the registry's ``code_paths`` first."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stateops.core.errors import RegistryError

__all__ = ["import_ref", "on_sys_path"]


def on_sys_path(folders: Sequence[Path]) -> None:
    for folder in reversed(folders):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))


def import_ref(ref: str, field: str, owner: str, code_paths: Sequence[Path]) -> Any:
    """``module:attribute`` named by ``owner``'s registry ``field`` (``query NAME``), imported:
    the one place that imports the user's code, from the registry's ``code_paths`` first."""
    on_sys_path(code_paths)
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name and not module_name.startswith(f"{err.name}."):
            raise RegistryError(  # the module is there; something it imports is not
                f"{owner}: {ref} fails to load: {err}; install it where the query "
                "runs, or put its folder in the registry's code_paths"
            ) from err
        raise RegistryError(
            f"{owner}: {field} {ref!r} cannot be imported ({err}); is its folder "
            "in the registry's code_paths?"
        ) from err
    except Exception as err:  # the user's module itself fails as it loads (a SyntaxError, ...)
        raise RegistryError(f"{owner}: {ref} fails to load: {type(err).__name__}: {err}") from err
    try:
        return getattr(module, attr)
    except AttributeError:
        own = [
            n
            for n, v in vars(module).items()
            if not n.startswith("_") and getattr(v, "__module__", None) == module_name
        ]
        raise RegistryError(
            f"{owner}: {field} {ref!r}: {module.__file__} has no {attr!r} (it "
            f"defines: {', '.join(sorted(own)) or 'no class or function'}); check the name"
        ) from None
