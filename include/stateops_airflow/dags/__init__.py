"""The lifecycle DAGs of one registry, rendered by :func:`lifecycle_dags` from a file in the
user's own DAGs folder::

    # dags/team_a.py
    from stateops_airflow.dags import lifecycle_dags

    globals().update(lifecycle_dags("/srv/team-a/registry.yaml", prefix="team_a_"))

One module per DAG (``stream_start``, ``stream_checkpoint_backup``, ...), each a ``build``
of its DAG for a :class:`Rendering`: the registry read at parse time (its schedules, a task
per query, the forms' choices), the DAG's id, and the deployment's own tags, owner,
``default_args`` and ``access_control``. A query with a schedule of its own (``schedules:
{start, backup, cleanup}``) has that DAG to itself, ``<prefix><name>__<query>``, on its
schedule; the shared DAG serves the others. The registry is the one of every task of the DAG:
the factory points the parse at it, and each task's process at it before the task runs (a
``pre_execute`` hook: ``STATEOPS_REGISTRY``), so two registries live in one Airflow.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from importlib import import_module
from typing import Any

from stateops.core.errors import StateOpsError
from stateops.core.registry import Query, Registry, load_registry, registry_path, timetable

__all__ = ["DAG_NAMES", "Rendering", "lifecycle_dags"]

# Every lifecycle DAG, by the name its id ends with.
DAG_NAMES = (
    "stream_start",
    "stream_bootstrap",
    "stream_checkpoint_backup",
    "stream_restore",
    "stream_restore_drill",
    "stream_snapshot_cleanup",
    "stream_backfill",
    "stream_source_migration",
    "stream_repartition",
    "stream_code_upgrade",
    "stream_health",
)
_TAGS = ("stateops", "streaming")
# The scheduled DAGs a query may have to itself, by the kind of its schedule (``schedules``).
_OWN_SCHEDULE = {
    "stream_start": "start",
    "stream_checkpoint_backup": "backup",
    "stream_snapshot_cleanup": "cleanup",
}


@dataclass(frozen=True)
class Rendering:
    """What one DAG of :func:`lifecycle_dags` is built for."""

    registry: Registry
    source: str  # the registry as its tasks read it: a file, or an object in the control store
    prefix: str = ""
    tags: tuple[str, ...] = ()
    owner: str | None = None
    default_args: Mapping[str, Any] = field(default_factory=dict)
    access_control: Mapping[str, Any] | None = None
    query: str | None = None
    """The one query of a DAG on that query's own schedule; None: the shared DAG."""
    apart: frozenset[str] = frozenset()
    """The queries the shared DAG leaves to DAGs of their own."""

    def queries(
        self, where: Callable[[Query], bool] = lambda query: True, refused: bool = False
    ) -> list[str]:
        """The queries this DAG has tasks for (:func:`stateops_airflow.tasks.registered_queries`
        of ``where`` and ``refused``): its one query, or all but those apart."""
        from stateops_airflow.tasks import registered_queries

        names = registered_queries(self.registry, where, refused)
        if self.query is not None:
            return [n for n in names if n == self.query]
        return [n for n in names if n not in self.apart]

    def schedule(self, kind: str) -> Any:
        """The DAG's schedule of ``kind`` (``start``, ``backup``, ``cleanup``) as ``@dag``
        takes it: its query's own, else the registry's."""
        query = self.registry.queries[self.query] if self.query is not None else None
        return timetable(self.registry.schedule(kind, query))

    def dag_args(self, name: str, *, tags: Iterable[str], default_args: Mapping[str, Any]):
        """``@dag`` keywords of DAG ``name``: its id (the prefix, the name, and ``__<query>``
        for a query's own), its tags
        (the project's, the DAG's, the deployment's), its ``default_args`` (the DAG's, the
        deployment's over them, and the hook that points each task at this registry), its
        ``access_control``."""
        args = {**default_args, **self.default_args}
        if self.owner:
            args["owner"] = self.owner
        args["pre_execute"] = _RegistryHook(self.source, args.get("pre_execute"))
        own = f"__{self.query}" if self.query is not None else ""
        built = {
            "dag_id": f"{self.prefix}{name}{own}",
            "tags": list(dict.fromkeys([*_TAGS, *tags, *self.tags])),
            "default_args": args,
        }
        if self.access_control is not None:
            built["access_control"] = dict(self.access_control)
        return built


class _RegistryHook:
    """A task's ``pre_execute``: its process reads the DAG's registry (then the deployment's
    own hook, if any). A class, not a closure: Airflow compares and serializes default_args."""

    def __init__(self, path: str, then: Any = None) -> None:
        self.path, self.then = path, then

    def __call__(self, context: Any) -> None:
        os.environ["STATEOPS_REGISTRY"] = self.path
        if self.then is not None:
            self.then(context)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _RegistryHook) and (self.path, self.then) == (
            other.path,
            other.then,
        )

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        return f"stateops registry {self.path}"


def lifecycle_dags(
    registry: str | os.PathLike[str] | None = None,
    *,
    prefix: str = "",
    only: Iterable[str] = DAG_NAMES,
    tags: Iterable[str] = (),
    owner: str | None = None,
    default_args: Mapping[str, Any] | None = None,
    access_control: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The lifecycle DAGs of ``registry`` (a file; None: ``STATEOPS_REGISTRY``, else the
    project's), by DAG id: ids ``<prefix><name>`` (``prefix``: two registries in one Airflow),
    ``only`` those of :data:`DAG_NAMES` named, with the deployment's ``tags``, ``owner``,
    ``default_args`` (over each DAG's own) and ``access_control`` (Airflow's, e.g.
    ``{"team_a": {"DAGs": {"can_read", "can_edit"}}}``). A bad argument is refused in one
    line; a registry that does not load is the DAG file's import error, naming it."""
    unknown = sorted(set(only) - set(DAG_NAMES))
    if unknown:
        raise StateOpsError(
            f"only: {', '.join(unknown)}: not a lifecycle DAG ({', '.join(DAG_NAMES)})"
        )
    if prefix and not _valid_prefix(prefix):
        raise StateOpsError(
            f"prefix {prefix!r}: letters, digits, _, . and - only, as in a DAG id (e.g. team_a_)"
        )
    path = _spelled(registry)
    rendering = Rendering(
        registry=_parsed(path),
        source=path,
        prefix=prefix,
        tags=tuple(tags),
        owner=owner,
        default_args=dict(default_args or {}),
        access_control=access_control,
    )
    dags = {}
    with _reading(path):
        for name in (n for n in DAG_NAMES if n in set(only)):
            build = import_module(f"stateops_airflow.dags.{name}").build
            for one in _renderings(rendering, _OWN_SCHEDULE.get(name)):
                dag = build(one)
                dags[dag.dag_id] = dag
    return dags


def _renderings(shared: Rendering, kind: str | None) -> list[Rendering]:
    """The DAGs of one name: the shared one, and one per query with its own schedule of
    ``kind`` (None: the DAG is not scheduled per query)."""
    queries = shared.registry.queries.values()
    apart = sorted(q.name for q in queries if kind and getattr(q.schedules, kind))
    own = [replace(shared, query=name) for name in apart]
    return [replace(shared, apart=frozenset(apart)), *own]


def _valid_prefix(prefix: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9_.-]+", prefix) is not None


def _spelled(registry: str | os.PathLike[str] | None) -> str:
    """The registry as every task is to read it: a file's absolute path, or an ``s3://``
    object as given (each reading fetches it anew: :func:`stateops.core.registry.
    registry_path`)."""
    given = str(registry or os.environ.get("STATEOPS_REGISTRY") or "")
    if given.startswith(("s3://", "s3a://")):
        return given
    return str(registry_path(given or None))


def _parsed(path: str) -> Registry:
    with _reading(path):
        return load_registry(path, switched=False)  # at parse time: no switch to read


@contextlib.contextmanager
def _reading(path: Any) -> Iterator[None]:
    """This process reads ``path`` as the registry while the DAGs are built (the tasks' code
    that runs at parse time: the forms' choices, the jobs' arguments), as before."""
    before = os.environ.get("STATEOPS_REGISTRY")
    os.environ["STATEOPS_REGISTRY"] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("STATEOPS_REGISTRY", None)
        else:
            os.environ["STATEOPS_REGISTRY"] = before
