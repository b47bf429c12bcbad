"""Cleanup planning speed on a synthetic checkpoint tree, against `find` in the same run.

    .venv/bin/python benchmarks/bench_cleanup.py [--files 1000000] [--retain 10] [--keep DIR]

The tree is bench_checkpoint_model.py's (HDFS-provider layout, a snapshot every 10 versions,
`.crc` sidecars). Planning = loading the checkpoint model and planning the cleanup (restart sets
of the retained batches, snapshot groups, old logs, sidecars); it deletes nothing. The goal is
at most 2x `find -printf '%s %p'`, which lists the same tree with sizes, as planning must.
The model lists the state partitions with up to min(4, cores) `find` processes at once, so
part of the gain on a machine with more cores is parallelism; "listing" shows that part.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "include"))

from bench_checkpoint_model import build_tree, timed  # noqa: E402

from stateops.control.target import Target  # noqa: E402
from stateops.core.storage import list_files  # noqa: E402
from stateops.ops.cleanup import plan_cleanup  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--retain", type=int, default=10, help="--retain-batches")
    parser.add_argument("--keep", help="build the tree here and keep it")
    args = parser.parse_args()
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-clean-")) / "ckpt"
    try:
        if not root.exists():
            t, batches = timed(lambda: build_tree(root, args.files))
            print(f"built {root}: {batches} batches in {t:.1f} s")
        find = ["find", str(root), "-type", "f", "-printf", "%s %p\\n"]
        find_s, _ = timed(lambda: subprocess.run(find, check=True, stdout=subprocess.DEVNULL))
        list_s, _ = timed(lambda: list_files(root))
        plan_s, plan = timed(lambda: plan_cleanup(Target(str(root), None, None), args.retain))
        files = plan["delete"]["files"] + plan["keep"]["files"]
        print(
            f"files: {files}; the plan deletes {plan['delete']['files']}, "
            f"keeps {plan['keep']['files']} (retaining batches {plan['retained']})"
        )
        print(f"find -printf '%s %p'   {find_s:7.2f} s   (baseline)")
        print(f"  listing (in the plan) {list_s:7.2f} s   {list_s / find_s:5.2f}x find")
        print(f"plan_cleanup           {plan_s:7.2f} s   {plan_s / find_s:5.2f}x find (goal <= 2)")
    finally:
        if not args.keep:
            shutil.rmtree(root.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
