"""Checkpoint model speed on a synthetic HDFS-provider tree, against `find` in the same run.

    .venv/bin/python benchmarks/bench_checkpoint_model.py [--files 1000000] [--keep DIR]

The tree has the layout Spark writes (offsets, commits, source log, one operator with
`N.delta`, a `N.snapshot` every 10 versions, `.crc` sidecars); file contents are tiny and
only offsets/commits/metadata are parsed. Reports seconds and the ratio to `find -type f`.
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

from synthetic import start_tree, write_batch_logs, write_log  # noqa: E402

from stateops.core.checkpoint import load_checkpoint  # noqa: E402
from stateops.core.report import checkpoint_report  # noqa: E402


def build_tree(root: Path, files: int, partitions: int = 200) -> int:
    # Per batch: 2 log files, 1 source entry, and per partition 1 delta (+ a snapshot every
    # 10th); each with a sidecar.
    per_batch = 2 * (3 + partitions + partitions / 10)
    batches = max(2, int(files / per_batch))
    start_tree(root, partitions)
    for b in range(batches):
        write_batch_logs(root, b)
    for p in range(partitions):
        d = root / "state" / "0" / str(p)
        for v in range(1, batches + 1):
            write_log(d / f"{v}.delta", "d")
            if v % 10 == 0:
                write_log(d / f"{v}.snapshot", "s")
    return batches


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--keep", help="build the tree here and keep it")
    args = parser.parse_args()
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-ckpt-")) / "ckpt"
    try:
        if not root.exists():
            t, batches = timed(lambda: build_tree(root, args.files))
            print(f"built {root}: {batches} batches in {t:.1f} s")
        n_files = sum(len(f) for _, _, f in os.walk(root))
        find_s, _ = timed(
            lambda: subprocess.run(
                ["find", str(root), "-type", "f"], check=True, stdout=subprocess.DEVNULL
            )
        )
        # The model needs every file's size, which costs a stat per file; so does this find.
        sized_s, _ = timed(
            lambda: subprocess.run(
                ["find", str(root), "-type", "f", "-printf", "%s %p\\n"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        )
        load_s, cp = timed(lambda: load_checkpoint(root))
        last = cp.last_committed_batch
        restart_s, needed = timed(lambda: cp.restart_files(last))
        report_s, _ = timed(lambda: checkpoint_report(cp))
        total = load_s + restart_s + report_s
        print(f"files: {n_files}, restart set after batch {last}: {len(needed)} files")
        print(f"find -type f              {find_s:7.2f} s   (baseline)")
        print(f"find -printf '%s %p'      {sized_s:7.2f} s   (baseline with sizes)")
        print(f"load_checkpoint           {load_s:7.2f} s   {load_s / find_s:5.2f}x find")
        print(f"restart_files(last)       {restart_s:7.2f} s")
        print(f"checkpoint_report         {report_s:7.2f} s")
        print(
            f"load + restart + report   {total:7.2f} s   {total / find_s:5.2f}x find, "
            f"{total / sized_s:5.2f}x find with sizes"
        )
    finally:
        if not args.keep:
            shutil.rmtree(root.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
