"""Cleanup planning on a checkpoint in S3, against `rclone lsf -R` of the same prefix, same run.

    .venv/bin/python benchmarks/bench_s3_cleanup.py [--files 100000] [--retain 10] [--runs 3]

The tree is bench_checkpoint_model.py's (HDFS-provider layout, 200 partitions, a snapshot every
10 versions, `.crc` sidecars), served by the embedded S3 endpoint (rclone serve s3 on
loopback). Planning = listing the prefix, reading the logs and metadata the model parses, and
planning the cleanup; it deletes nothing. The baseline lists the same prefix with sizes
(`rclone lsf -R --format sp`), as planning must, once with rclone's default directory-by-
directory listing and once with `--fast-list`. Best of --runs each; the S3 requests each made
are counted (ours by the client's own count, rclone's from `--dump headers`). Goal: planning
at most 1.5x `rclone lsf -R`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "include"))

from bench_checkpoint_model import build_tree, timed  # noqa: E402

from stateops.control.target import Target  # noqa: E402
from stateops.core import storage  # noqa: E402
from stateops.dev.s3server import free_port, start_s3_server  # noqa: E402
from stateops.ops.cleanup import plan_cleanup  # noqa: E402

KEY, SECRET = "bench", "bench-secret"


def rclone_lsf(rclone: str, endpoint: str, fast: bool) -> tuple[float, int, int]:
    """(seconds, lines listed, requests) of `rclone lsf -R` of bench/ckpt."""
    env = {
        **os.environ,
        "RCLONE_CONFIG_BENCH_TYPE": "s3",
        "RCLONE_CONFIG_BENCH_PROVIDER": "Other",
        "RCLONE_CONFIG_BENCH_ENDPOINT": endpoint,
        "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": KEY,
        "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": SECRET,
    }
    cmd = [
        rclone,
        "lsf",
        "-R",
        "--files-only",
        "--format",
        "sp",
        "--config",
        os.devnull,
        *(["--fast-list"] if fast else []),
        "bench:bench/ckpt",
    ]
    seconds, out = timed(lambda: subprocess.run(cmd, env=env, check=True, capture_output=True))
    lines = out.stdout.count(b"\n")
    # The same once more, counting its requests (the dump slows it: not timed).
    dumped = subprocess.run(
        [*cmd, "-vv", "--dump", "headers"], env=env, check=True, capture_output=True
    )
    return seconds, lines, dumped.stderr.count(b"HTTP REQUEST")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--retain", type=int, default=10, help="--retain-batches")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    served = Path(tempfile.mkdtemp(prefix="bench-s3-clean-"))
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = None
    try:
        t, batches = timed(lambda: build_tree(served / "bench" / "ckpt", args.files))
        print(f"built {served}/bench/ckpt: {batches} batches in {t:.1f} s")
        server = start_s3_server(served, ["bench"], KEY, SECRET, port)
        os.environ.update(
            STATEOPS_S3_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET
        )
        rclone = shutil.which("rclone") or str(Path(sys.executable).parent / "rclone")

        baselines = {}
        for fast in (False, True):
            runs = [rclone_lsf(rclone, endpoint, fast) for _ in range(args.runs)]
            baselines[fast] = (min(r[0] for r in runs), runs[0][1], runs[0][2])
        plans, target = [], Target("s3://bench/ckpt", None, None)
        for _ in range(args.runs):
            before = storage.request_count()
            seconds, plan = timed(lambda: plan_cleanup(target, args.retain))
            plans.append((seconds, storage.request_count() - before, plan))
        plan_s = min(p[0] for p in plans)
        requests, plan = plans[0][1], plans[0][2]

        base_s, listed, base_requests = baselines[False]
        fast_s, _, fast_requests = baselines[True]
        files = plan["delete"]["files"] + plan["keep"]["files"]
        print(
            f"objects: {files} (rclone listed {listed}); the plan deletes "
            f"{plan['delete']['files']}, keeps {plan['keep']['files']}"
        )
        print(f"best of {args.runs}:")
        print(
            f"  rclone lsf -R              {base_s:7.2f} s  {base_requests:6} requests (baseline)"
        )
        print(
            f"  rclone lsf -R --fast-list  {fast_s:7.2f} s  {fast_requests:6} requests  "
            f"{fast_s / base_s:5.2f}x"
        )
        print(
            f"  plan_cleanup on s3://      {plan_s:7.2f} s  {requests:6} requests  "
            f"{plan_s / base_s:5.2f}x rclone lsf -R (goal <= 1.5), "
            f"{plan_s / fast_s:5.2f}x --fast-list"
        )
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=20)
        shutil.rmtree(served, ignore_errors=True)


if __name__ == "__main__":
    main()
