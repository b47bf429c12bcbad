"""The lease: acquire + renew + release of a query's lock in an S3 control store (conditional
writes on the embedded SeaweedFS endpoint), against the local lock file under ``flock``
(the baseline, measured in the same run).

    .venv/bin/python benchmarks/bench_lease.py [--cycles 50]

Each cycle is what every lifecycle operation and every run pays once (acquire, one renewal,
release); a run renews every third of the lock's TTL (200 s by default), so a run's extra cost
is the acquire and release plus one renewal every 200 s. Prints the median milliseconds per
cycle of each, the S3 requests a cycle sends, and the ratio to the local file.
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

from stateops.control.lock import QueryLock  # noqa: E402
from stateops.core.storage import location, request_count  # noqa: E402
from stateops.dev.s3server import free_port, start_seaweedfs, stop_server  # noqa: E402

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
        finally:
            stop_server(server)
    base, cost = statistics.median(local), statistics.median(s3)
    print(f"cycles: {args.cycles} (acquire + renew + release), median per cycle")
    print(f"local lock file (baseline) {base:8.2f} ms  1.0x")
    print(f"S3 control store           {cost:8.2f} ms  {cost / base:.1f}x  {requests:.0f} requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
