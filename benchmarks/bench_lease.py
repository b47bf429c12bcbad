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

And what the fence against stalled holders costs (issue 74): one guard as a destructive write
passes it (the holder's own deadline; the store asked at most once a second), one with the
store asked (a run's batch fence), and a cleanup's deletes of --files files (S3 objects, 1,000
a request, and local files, one guard each) under a held lease against the same deletes with
no lease (the deletes before the fence), both measured in this run.
"""

from __future__ import annotations

import argparse
import contextlib
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
from stateops.core.storage import delete_files, location, request_count, upload  # noqa: E402
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


def guards(place, n: int, fresh: float) -> list[float]:
    """Microseconds of each of ``n`` guards of a held lease (``fresh``: how old a confirmation
    from the store may be; 0 asks it every time)."""
    took = []
    with QueryLock(place, "q", "bench") as lock:
        for _ in range(n):
            start = time.perf_counter()
            lock.ensure(fresh=fresh)
            took.append((time.perf_counter() - start) * 1e6)
    return took


def deletes(root, files: int, place) -> float:
    """Seconds to delete ``files`` files under ``root`` (written first), under a lease held at
    ``place`` (None: no lease, no guard)."""
    rels = [f"state/0/{i % 200}/{i}.delta" for i in range(files)]
    if isinstance(root, Path):
        for rel in rels:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(b"x")
    else:
        with tempfile.TemporaryDirectory() as local:
            for rel in rels:
                (Path(local) / rel).parent.mkdir(parents=True, exist_ok=True)
                (Path(local) / rel).write_bytes(b"x")
            upload(Path(local), root, rels)
    lock = QueryLock(place, "q", "cleanup") if place is not None else contextlib.nullcontext()
    with lock:
        start = time.perf_counter()
        delete_files(root, rels)
        return time.perf_counter() - start


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
    parser.add_argument("--files", type=int, default=10000, help="files a cleanup deletes")
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
            local_lock = Path(tmp) / "locks" / "q.lock"
            fenced = {
                "local": (guards(local_lock, 1000, 1.0), guards(local_lock, 200, 0)),
                "S3": (guards(place, 1000, 1.0), guards(place, 200, 0)),
            }
            cleanup = {
                "local": [
                    deletes(Path(tmp) / f"ckpt-{guard}", args.files, lock)
                    for guard, lock in (("bare", None), ("guarded", local_lock))
                ],
                "S3": [
                    deletes(location(f"s3://{BUCKET}/ckpt-{guard}"), args.files, lock)
                    for guard, lock in (("bare", None), ("guarded", place))
                ],
            }
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
    print("the fence (median per guard; baseline: the lease cycle above)")
    for where, (held, asked) in fenced.items():
        print(f"{'guard, ' + where + ', own deadline':<34} {statistics.median(held):8.1f} us")
        print(f"{'guard, ' + where + ', store asked':<34} {statistics.median(asked):8.1f} us")
    print(f"a cleanup's deletes of {args.files} files (baseline: the same, no lease held)")
    for where, (bare, guarded) in cleanup.items():
        print(_line(f"deletes, {where}, no lease", bare * 1000, bare * 1000, None))
        print(_line(f"deletes, {where}, guarded", bare * 1000, guarded * 1000, None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
