"""Full and incremental checkpoint backup against `rclone copy` of the same files, same endpoint.

    .venv/bin/python benchmarks/bench_backup.py [--gb 1.0] [--partitions 50]

Generates a checkpoint tree with Spark's HDFS-provider layout (offsets, commits, source log,
per partition a snapshot at version 10 and deltas): the snapshots hold random bytes, so the
restart set after batch 10 is about ``--gb`` GB of distinct content. Starts the embedded S3
endpoint (rclone serve s3 on loopback), then in the same run:

- stateops backup of the restart set (hashing included) into an empty prefix;
- baseline: ``rclone copy --files-from`` of exactly the same files into another prefix, with
  the same parallelism (8 transfers);
- one more batch (a small delta per partition), backed up incrementally.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "include"))

from synthetic import start_tree, write_batch_logs  # noqa: E402

from stateops.core.checkpoint import load_checkpoint  # noqa: E402
from stateops.core.s3 import S3Settings, s3_client  # noqa: E402
from stateops.dev.s3server import free_port, start_s3_server  # noqa: E402
from stateops.ops.backup import backup_checkpoint  # noqa: E402

KEY, SECRET = "bench", "bench-secret"


def add_batch(root: Path, b: int, partitions: int, delta_bytes: int) -> None:
    write_batch_logs(root, b)
    for p in range(partitions):
        (root / "state" / "0" / str(p) / f"{b + 1}.delta").write_bytes(os.urandom(delta_bytes))


def build(root: Path, gb: float, partitions: int) -> None:
    start_tree(root, partitions)
    for b in range(10):
        add_batch(root, b, partitions, 64 << 10)
    snapshot_bytes = int(gb * (1 << 30) / partitions)
    for p in range(partitions):  # version 10: the base a restart after batch 9 or 10 loads
        (root / "state" / "0" / str(p) / "10.snapshot").write_bytes(os.urandom(snapshot_bytes))
    add_batch(root, 10, partitions, 64 << 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--partitions", type=int, default=50)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-backup-"))
    port = free_port()
    server = None
    try:
        ckpt = tmp / "checkpoint"
        build(ckpt, args.gb, args.partitions)
        server = start_s3_server(tmp / "s3", ["bench"], KEY, SECRET, port)
        endpoint = f"http://127.0.0.1:{port}"
        client = s3_client(S3Settings(endpoint, "us-east-1", KEY, SECRET))
        files = load_checkpoint(ckpt).restart_files(10)
        size = sum((ckpt / f).stat().st_size for f in files)

        start = time.perf_counter()
        full = backup_checkpoint(ckpt, "s3://bench/stateops", client, log=lambda _: None)
        ours = time.perf_counter() - start
        assert full["bytes"] == size  # identical tiny .crc sidecars are uploaded once

        listing = tmp / "files.txt"
        listing.write_text("\n".join(files) + "\n")
        env = {
            **os.environ,
            "RCLONE_CONFIG_BENCH_TYPE": "s3",
            "RCLONE_CONFIG_BENCH_PROVIDER": "Other",
            "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": KEY,
            "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": SECRET,
            "RCLONE_CONFIG_BENCH_ENDPOINT": endpoint,
        }
        rclone = shutil.which("rclone") or str(Path(sys.executable).parent / "rclone")
        start = time.perf_counter()
        subprocess.run(
            [
                rclone,
                "copy",
                "--files-from",
                str(listing),
                "--no-traverse",
                "--transfers",
                "8",
                str(ckpt),
                "bench:bench/rclone-copy",
            ],
            env=env,
            check=True,
            capture_output=True,
        )
        baseline = time.perf_counter() - start

        add_batch(ckpt, 11, args.partitions, 64 << 10)
        start = time.perf_counter()
        incremental = backup_checkpoint(ckpt, "s3://bench/stateops", client, log=lambda _: None)
        inc_seconds = time.perf_counter() - start

        mb = size / (1 << 20)
        print(f"restart set after batch 10: {len(files)} files, {mb:.0f} MB")
        print(f"rclone copy (baseline)   {baseline:7.1f} s  {mb / baseline:7.1f} MB/s")
        print(
            f"stateops backup (full)   {ours:7.1f} s  {mb / ours:7.1f} MB/s  "
            f"{baseline / ours:.2f}x rclone (incl. sha256 of every file)"
        )
        up = incremental["uploaded"]
        print(
            f"stateops backup (+1 batch) {inc_seconds:5.1f} s  {up['objects']} objects, "
            f"{up['bytes'] / (1 << 20):.1f} MB uploaded, "
            f"{incremental['reused']['bytes'] / (1 << 20):.0f} MB reused"
        )
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
