"""``make airflow``'s last step, over the Airflow REST API (no Airflow import: ``airflow dags
list`` costs a Python start and 3 CPU seconds a call, and the script polled it every 2 s while
the DAG processor, on the same cores, was parsing the DAGs it waited for):

    python -m stateops.dev.airflow_dags URL PASSWORDS_FILE --expect N [--unpause "DAG ..."]

waits until the API lists the N lifecycle DAGs (``stream_*``), unpauses those named (default:
all of them) and prints ``N lifecycle DAGs; unpaused: ...``. Exits 1 with one line if they are
not all there within ``--timeout`` seconds."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

PREFIX = "stream_"


def api_call(url: str, method: str = "GET", body: dict | None = None, token: str = "") -> dict:
    """One request to the Airflow REST API (JSON in and out; ``token``: a bearer token)."""
    request = urllib.request.Request(
        url,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"}
        | ({"Authorization": f"Bearer {token}"} if token else {}),
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"{}")


def api_token(base: str, password: str, user: str = "admin") -> str:
    """A bearer token for ``user`` of the simple auth manager."""
    login = {"username": user, "password": password}
    return api_call(f"{base}/auth/token", "POST", login)["access_token"]


def lifecycle_dags(base: str, token: str) -> list[str]:
    """The ``stream_*`` DAGs the API knows (the DAG processor stored them)."""
    dags = api_call(f"{base}/api/v2/dags?limit=1000&dag_id_pattern={PREFIX}", token=token)["dags"]
    return sorted(d["dag_id"] for d in dags if d["dag_id"].startswith(PREFIX))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stateops.dev.airflow_dags")
    parser.add_argument("url", help="the API server, e.g. http://127.0.0.1:8080")
    parser.add_argument(
        "passwords_file", help='the simple auth manager\'s ({"admin": PASSWORD}; not on argv)'
    )
    parser.add_argument("--expect", type=int, required=True, help="lifecycle DAGs to wait for")
    parser.add_argument("--unpause", default="", help="DAG ids, space-separated (default: all)")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)
    base = args.url.rstrip("/")
    with open(args.passwords_file) as f:
        token = api_token(base, json.load(f)["admin"])
    deadline = time.monotonic() + args.timeout
    while len(listed := lifecycle_dags(base, token)) < args.expect:
        if time.monotonic() > deadline:
            print(
                f"error: Airflow lists {len(listed)} of {args.expect} lifecycle DAGs after "
                f"{args.timeout:.0f} s; see the dag-processor's log (airflow.log)",
                file=sys.stderr,
            )
            return 1
        time.sleep(1)
    unpause = args.unpause.split() or listed
    for dag in unpause:
        try:
            api_call(f"{base}/api/v2/dags/{dag}", "PATCH", {"is_paused": False}, token)
        except urllib.error.HTTPError as e:
            print(f"error: cannot unpause {dag}: HTTP {e.code}; known: {listed}", file=sys.stderr)
            return 1
    print(f"{len(listed)} lifecycle DAGs; unpaused: {' '.join(unpause)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
