"""The control store: a query's lease and records in S3 (conditional writes on the embedded
SeaweedFS endpoint), against the local files (the baseline, measured in the same run).

    .venv/bin/python benchmarks/bench_lease.py [--cycles 50]

Two cycles, each what every run pays once:
- **lease**: acquire + renew + release of the lock (a run renews every third of the lock's TTL,
  200 s by default, so a run's extra cost is the acquire and release plus one renewal every
  200 s);
- **records**: reading the registry (each query's switch), writing the run's summary (by run
  id, the index and the latest) and reading it back by run id, as the task after the Spark job
  does.
Prints the median milliseconds per cycle of each, the S3 requests a cycle sends, and the
ratio to the local files.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "include"))

import yaml  # noqa: E402

from stateops.control.lock import QueryLock  # noqa: E402
from stateops.core.registry import load_registry  # noqa: E402
from stateops.core.storage import location, request_count  # noqa: E402
from stateops.dev.s3server import free_port, start_seaweedfs, stop_server  # noqa: E402
from stateops.ops.start import read_summary, write_summary  # noqa: E402

KEY, SECRET, BUCKET = "bench-lease", "bench-lease-secret", "control"


def cycles(place, n: int) -> list[float]:
    """Milliseconds of each of ``n`` acquire + renew + release cycles on ``place``."""
    took = []
    for _ in range(n):
        start = time.perf_counter()
        lock = QueryLock(place, "q", "bench")
        lock.acquire()
        lock.renew()
        lock.release()
        took.append((time.perf_counter() - start) * 1000)
        assert not lock.lost
    return took


def records(registry_file: Path, n: int) -> list[float]:
    """Milliseconds of each of ``n`` runs' records: the registry read, the summary written and
    read back by run id."""
    took = []
    for i in range(n):
        start = time.perf_counter()
        registry = load_registry(registry_file)
        write_summary(registry, {"query": "page_visits", "run_id": f"run-{i}", "status": "ok"})
        assert read_summary(registry, "page_visits", f"run-{i}")["status"] == "ok"
        took.append((time.perf_counter() - start) * 1000)
    return took


def _registry(folder: Path, control: str | None) -> Path:
    """The project's registry, its data in ``folder``, its leases and records in ``control``."""
    raw = yaml.safe_load((ROOT / "registry.yaml").read_text())
    raw.update(data_dir=str(folder), **({"control": control} if control else {}))
    folder.mkdir(parents=True)
    (folder / "registry.yaml").write_text(yaml.safe_dump(raw))
    return folder / "registry.yaml"


def _line(label: str, base: float, cost: float, requests: float | None) -> str:
    sent = "" if requests is None else f"  {requests:.0f} requests"
    return f"{label:<34} {cost:8.2f} ms  {cost / base:5.1f}x{sent}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=50)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        server = start_seaweedfs(Path(tmp) / "s3", [BUCKET], KEY, SECRET, port)
        try:
            os.environ.update(
                STATEOPS_S3_ENDPOINT_URL=f"http://127.0.0.1:{port}",
                AWS_ACCESS_KEY_ID=KEY,
                AWS_SECRET_ACCESS_KEY=SECRET,
            )
            os.environ.pop("STATEOPS_CHECKPOINT_CONN_ID", None)
            local = cycles(Path(tmp) / "locks" / "q.lock", args.cycles)
            place = location(f"s3://{BUCKET}/bench/q/lease.json")
            cycles(place, 1)  # the client and the store's probe: once per process
            before = request_count()
            s3 = cycles(place, args.cycles)
            requests = (request_count() - before) / args.cycles
            queries = len(load_registry(ROOT / "registry.yaml").queries)
            local_records = records(_registry(Path(tmp) / "local", None), args.cycles)
            on_s3 = _registry(Path(tmp) / "fleet", f"s3://{BUCKET}/bench")
            before = request_count()
            s3_records = records(on_s3, args.cycles)
            record_requests = (request_count() - before) / args.cycles
        finally:
            stop_server(server)
    print(f"cycles: {args.cycles}, median per cycle; baselines: the local files")
    base = statistics.median(local)
    print(_line("lease, local lock file", base, base, None))
    print(_line("lease, S3 control store", base, statistics.median(s3), requests))
    base = statistics.median(local_records)
    print(_line(f"records ({queries} queries), local", base, base, None))
    print(
        _line(
            f"records ({queries} queries), S3", base, statistics.median(s3_records), record_requests
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
