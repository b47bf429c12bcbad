"""What an operation acts on, resolved once from what the user typed.

Every lifecycle operation takes a :class:`Target`: the checkpoint, the registry (None where a
path's registry cannot be read) and the registered query that owns the checkpoint (None for a
checkpoint nobody registered). It hands out what the operations used to assemble at each call
site: the query's lifecycle lock and its backup location. The CLI builds one with
:func:`resolve_target` from a query's name or a checkpoint location, the Airflow tasks and the
library with :func:`query_target` from a registered query's name.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

from stateops.control.audit import audit_dir
from stateops.control.lock import QueryLock
from stateops.control.markers import read_record, refuse_retired, write_holder
from stateops.core.checkpoint import require_checkpoint_dir
from stateops.core.errors import StateOpsError
from stateops.core.registry import (
    LEASE_SECONDS,
    Query,
    Registry,
    checkpoint_of,
    load_registry,
)
from stateops.core.storage import S3Path, in_s3, location

__all__ = ["Target", "checkpoint_target", "query_target", "resolve_target"]


def _anchor_path(checkpoint: str) -> S3Path:
    """Where an S3 checkpoint names the lease every process acting on it takes."""
    return audit_dir(checkpoint) / "control.json"


# Operations that lock a checkpoint only to read it still (a transplant from it): a retired
# checkpoint (stateops.control.markers.write_retired) is theirs to read.
READS_ONLY = frozenset({"transplant"})

# Spark's default spark.sql.streaming.stateStore.minDeltasForSnapshot.
SPARK_MIN_DELTAS = 10


@dataclass(frozen=True)
class Target:
    """A checkpoint, the registry it was resolved in, and the query that owns it (if any)."""

    checkpoint: str
    registry: Registry | None
    query: Query | None

    @property
    def name(self) -> str | None:
        """The owning query's name, or None for an unregistered checkpoint."""
        return self.query.name if self.query is not None else None

    @property
    def min_deltas_for_snapshot(self) -> int:
        """The owning query's ``minDeltasForSnapshot``, else Spark's default."""
        return self.query.state_store.min_deltas_for_snapshot if self.query else SPARK_MIN_DELTAS

    def require_registry(self) -> Registry:
        """The registry, or a one-line refusal for a checkpoint whose registry cannot be read."""
        if self.registry is None:
            raise StateOpsError(
                f"{self.checkpoint}: no readable registry; pass --registry or set STATEOPS_REGISTRY"
            )
        return self.registry

    def require_query(self, what: str) -> Query:
        """The owning query, or a one-line refusal that says what to give instead (``what``)."""
        if self.query is None:
            raise StateOpsError(f"{self.checkpoint}: not a registered query's checkpoint; {what}")
        return self.query

    def lock(self, operation: str, run_id: str | None) -> QueryLock:
        """The lifecycle lock of the query that owns the checkpoint (a running query holds it),
        taken for ``operation`` by run ``run_id`` (None: the lock draws one). Refused for a
        checkpoint under a retirement hold (:func:`stateops.control.markers.refuse_retired`),
        but by an operation that only reads it (:data:`READS_ONLY`)."""
        if operation not in READS_ONLY:
            refuse_retired(self.checkpoint)
        path, holder = self._lock_place
        self._anchor(path, holder)
        ttl = self.registry.lease_seconds if self.registry else LEASE_SECONDS
        # An S3 checkpoint's drivers fence their writes on the holder record (write_holder).
        named = functools.partial(write_holder, self.checkpoint) if in_s3(self.checkpoint) else None
        return QueryLock(path, holder, operation, run_id, ttl_seconds=ttl, on_acquire=named)

    @property
    def lock_file(self) -> Path | S3Path:
        """Where that lock lives (its hold beside it): what ``stateops lock`` and the status
        read."""
        return self._lock_place[0]

    @functools.cached_property
    def _lock_place(self) -> tuple[Path | S3Path, str]:
        """The lock file and the name it is taken under (read once per target: the anchor is
        an S3 read): where the checkpoint's anchor says
        (:meth:`_anchor`), else a registered query's, else one beside an unregistered
        checkpoint's audit log, once the path is known to be a checkpoint (a mistyped path
        must not get a ``.audit`` folder beside it)."""
        anchored = self._anchored()
        if anchored is not None:
            return anchored
        if self.query is not None and self.registry is not None:
            return self.registry.lock_path(self.query.name), self.query.name
        root = require_checkpoint_dir(self.checkpoint)
        if isinstance(root, S3Path):
            # Where the registered queries' leases are (the control store, else the state
            # folder): a lock beside an S3 checkpoint would need conditional writes on its
            # store, which the control store is probed for (docs/checkpoints-on-s3.md).
            if self.registry is None:
                raise StateOpsError(
                    f"{root}: an S3 checkpoint's lock lives with the registry's leases, and "
                    "no registry is readable; pass --registry or set STATEOPS_REGISTRY"
                )
            if self.registry.control:
                place = ("_checkpoints", root.bucket, root.key, "lease.json")
                return self.registry.control_place(*place), str(root)
            path = self.registry.state_dir / "locks" / "s3" / root.bucket / f"{root.key}.lock"
            return path, str(root)
        return audit_dir(root) / "lifecycle.lock", str(root)

    def _anchored(self) -> tuple[S3Path, str] | None:
        """The lease an S3 checkpoint's anchor names (None: no anchor, or a local checkpoint),
        refused in one line where this process's registry names another control store or
        none: every process that acts on the checkpoint (a bastion's CLI whose registry copy
        lacks ``control``, a driver on a node with an older registry) must take the one lease
        the others take, or it excludes nothing."""
        if not in_s3(self.checkpoint):
            return None
        record = read_record(_anchor_path(self.checkpoint))
        if record is None:
            return None
        control = self.registry.control if self.registry else None
        if record.get("control") != control:
            where = f"this registry ({self.registry.path})" if self.registry else "no registry"
            raise StateOpsError(
                f"{self.checkpoint}: its lease lives in the control store {record.get('control')} "
                f"(every host that acts on it must take that one), and {where} names "
                f"{control or 'none'}: set the registry's control: {record.get('control')}"
            )
        return location(record["lease"]), record["holder"]

    def _anchor(self, place: Path | S3Path, holder: str) -> None:
        """Anchor an S3 checkpoint to the lease ``place`` of the control store, the first time
        a lease in one is taken for it: ``<checkpoint>.audit/control.json``, created only where
        none is (``If-None-Match``); every later process reads it (:meth:`_anchored`)."""
        control = self.registry.control if self.registry else None
        if not (control and in_s3(self.checkpoint)) or not isinstance(place, S3Path):
            return
        anchor = _anchor_path(self.checkpoint)
        record = {"control": control, "lease": str(place), "holder": holder}
        if not anchor.write_if(json.dumps(record).encode(), None):
            self._anchored()  # another process anchored it first: its must be this one's

    def backup_location(
        self, given: str | None = None, give: str = "--to s3://BUCKET/PREFIX"
    ) -> str:
        """``given``, else the registry's ``backups.url``/QUERY for a registered query's
        checkpoint; else a one-line refusal that says what to ``give``."""
        if given:
            return given
        if self.query is None or self.registry is None:
            raise StateOpsError(
                f"{self.checkpoint}: not a registered query's checkpoint, so there is no backup "
                f"location; give {give}"
            )
        return self.registry.backups.url_for(self.query.name)


def resolve_target(typed: str, registry_file: str | os.PathLike[str] | None = None) -> Target:
    """What the user typed, a checkpoint location or a registered query's name
    (:func:`stateops.core.registry.checkpoint_of`: the one rule for telling them apart)."""
    return Target(*checkpoint_of(typed, registry_file))


def checkpoint_target(registry: Registry, checkpoint: str | os.PathLike[str]) -> Target:
    """``checkpoint`` in an already loaded ``registry``, with the query that owns it (if any)."""
    return Target(str(checkpoint), registry, registry.owner_of(checkpoint))


def query_target(registry: Registry | str | os.PathLike[str] | None, name: str) -> Target:
    """Registered query ``name`` of ``registry`` (a loaded registry, its file, or None: the
    default one); an unknown name is refused in one line."""
    if not isinstance(registry, Registry):
        registry = load_registry(registry)
    query = registry.query(name)
    return Target(query.checkpoint, registry, query)
