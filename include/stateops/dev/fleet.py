"""What ``make fleet`` (scripts/fleet.sh) needs from Python: the fleet's registry and the name
each Celery worker gives its tasks.

The fleet is the production shape on loopback: Postgres, Redis, Airflow's CeleryExecutor with
two workers that share no folder, a Spark standalone cluster, Kafka and S3. What the workers
share is what hosts would: the control store, the checkpoints and the sinks in S3, Kafka and
the Spark cluster. So its registry is the project's Kafka queries with everything they keep
in one bucket (:func:`fleet_registry`).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import yaml

__all__ = ["fleet_registry", "hostname"]


def hostname() -> str:
    """Airflow's ``[core] hostname_callable`` on a fleet worker: its own name
    (``STATEOPS_FLEET_HOST``), where the host's would be the same for both workers here."""
    return os.environ.get("STATEOPS_FLEET_HOST") or socket.getfqdn()


def fleet_registry(source: Path, dest: Path, bucket: str) -> list[str]:
    """Write to ``dest`` the registry ``source`` as the fleet runs it: its Kafka queries (a
    file source is a folder on one host), each with its checkpoint and sink under
    ``s3://BUCKET/``, the control store and the backups there too. Returns the queries."""
    raw = yaml.safe_load(source.read_text(encoding="utf-8"))
    queries = {
        name: spec
        for name, spec in raw["queries"].items()
        if spec.get("source", {}).get("format") == "kafka"
    }
    for name, spec in queries.items():
        spec["checkpoint"] = f"s3://{bucket}/checkpoints/{name}"
        spec["sink"] = {**spec["sink"], "path": f"s3://{bucket}/output/{name}"}
    raw.update(
        queries=queries,
        control=f"s3://{bucket}/control",
        backups={**raw.get("backups", {}), "url": f"s3://{bucket}/backups"},
    )
    raw.pop("data_dir", None)  # each worker's own: STATEOPS_DATA_DIR
    dest.write_text(
        "# The fleet's registry (make fleet), written from "
        f"{source}: every query's state and output in s3://{bucket}/.\n"
        + yaml.safe_dump(raw, sort_keys=False),
        encoding="utf-8",
    )
    return list(queries)


def main(argv: list[str] | None = None) -> int:
    """``python -m stateops.dev.fleet registry SOURCE DEST BUCKET``: prints the queries."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4 or args[0] != "registry":
        print("usage: python -m stateops.dev.fleet registry SOURCE DEST BUCKET", file=sys.stderr)
        return 2
    print(*fleet_registry(Path(args[1]), Path(args[2]), args[3]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
