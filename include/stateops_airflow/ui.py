"""The "Streaming state" view: an Airflow 3 plugin (a FastAPI app at ``/stateops`` and a nav
entry under Browse that shows it), read-only, per registered query. It shows what
``stateops status`` prints (:func:`stateops.status.query_status`), for a logged-in user only.
It also registers the middleware that checks the manual DAGs' trigger forms before a run is
created (:mod:`stateops_airflow.forms`). Registered by the package's ``airflow.plugins``
entry point (``stateops_ui``), or, in a checkout not installed, by ``plugins/``.
"""

from __future__ import annotations

import html
import mimetypes
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any

from airflow.api_fastapi.core_api.security import requires_authenticated
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, Response

from stateops.core.errors import StateOpsError
from stateops.core.registry import load_registry
from stateops.core.report import format_bytes
from stateops.core.storage import S3Path
from stateops.ops.backup import describe_drill
from stateops.spark.expectations import data_docs_path
from stateops.status import describe_cleanup, describe_holder, query_status
from stateops_airflow.forms import FormCheck

app = FastAPI(title="Streaming state", dependencies=[Depends(requires_authenticated())])
HISTORY = timedelta(days=7)  # the figures over time the view draws (stateops.control.history)


def _statuses() -> list[dict[str, Any]]:
    from stateops_airflow.tasks import backup_lister

    registry = load_registry()
    client, unlisted = backup_lister(registry)
    return [
        query_status(registry, name, client, unlisted, history=HISTORY) for name in registry.names
    ]


@app.get("/api/status")
def status_json() -> list[dict[str, Any]]:
    return _statuses()


@app.get("/", response_class=HTMLResponse)
def status_page() -> str:
    try:
        body = "".join(_query_card(s) for s in _statuses())
    except StateOpsError as err:
        body = f'<p class="error">{_e(err)}</p>'
    return _PAGE.format(body=body)


@app.get("/docs/{query}/{path:path}")
def data_docs(query: str, path: str) -> Response:
    """A query's Great Expectations Data Docs (static files, inside their own folder only): a
    local folder, or for a checkpoint in S3 its prefix there (any host's validations)."""
    missing = HTTPException(404, f"no such Data Docs file: {path}")
    try:
        root = data_docs_path(load_registry().query(query)).parent
    except StateOpsError as err:
        raise HTTPException(404, str(err)) from None
    if isinstance(root, S3Path):
        if ".." in PurePosixPath(path).parts:
            raise missing
        try:
            body = (root / path).read_bytes()
        except (FileNotFoundError, StateOpsError):
            raise missing from None
        return Response(body, media_type=mimetypes.guess_type(path)[0] or "text/plain")
    root = root.resolve()
    file = (root / path).resolve()
    if not file.is_relative_to(root) or not file.is_file():
        raise missing
    return FileResponse(file)


def _e(value: Any) -> str:
    return html.escape("-" if value is None else str(value))


def _rows(headers: list[str], rows: list[list[Any]]) -> str:
    head = "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in headers) + "</tr>" if headers else ""
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table>{head}{body}</table>" if rows else "<p>none</p>"


def _chart(groups: list[dict[str, Any]]) -> str:
    """Bytes per snapshot group as a small horizontal bar chart (inline SVG)."""
    if not groups:
        return ""
    top = max(g["bytes"] for g in groups) or 1
    bars = "".join(
        f'<text x="0" y="{i * 20 + 13}">group {g["group_id"]}</text>'
        f'<rect x="70" y="{i * 20 + 2}" width="{max(1, 220 * g["bytes"] // top)}" height="14">'
        f"<title>versions {g['versions'][0]}-{g['versions'][1]}</title></rect>"
        f'<text x="{75 + 220 * g["bytes"] // top}" y="{i * 20 + 13}">'
        f"{_e(format_bytes(g['bytes']))}</text>"
        for i, g in enumerate(groups)
    )
    return (
        f'<svg class="chart" width="380" height="{len(groups) * 20 + 4}" '
        f'role="img" aria-label="bytes per snapshot group">{bars}</svg>'
    )


def _trend(points: list[dict[str, Any]], field: str, label: str) -> str:
    """``field`` of the points that have it over time, as a line (inline SVG), with its first
    and last figures; nothing with fewer than two."""
    seen = [
        (datetime.fromisoformat(p["at"]).timestamp(), p[field])
        for p in points
        if p.get(field) is not None
    ]
    if len(seen) < 2:
        return ""
    (t0, first), (t1, last) = seen[0], seen[-1]
    top = max(v for _, v in seen) or 1
    line = " ".join(
        f"{(t - t0) / ((t1 - t0) or 1) * 360:.1f},{64 - v / top * 60:.1f}" for t, v in seen
    )
    return (
        f'<figure><svg class="trend" width="360" height="66" viewBox="0 0 360 66" '
        f'role="img" aria-label="{_e(label)} over time"><polyline points="{line}"/>'
        f'<text x="2" y="12">{_e(top)}</text></svg><figcaption>{_e(label)}: {_e(first)} '
        f"to {_e(last)}, {len(seen)} points, {_minute(t0)} to {_minute(t1)} UTC</figcaption>"
        "</figure>"
    )


def _minute(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M")


def _history(s: dict[str, Any]) -> str:
    """The query's state rows (its runs) and Kafka lag (its health checks) over time."""
    points = s.get("history") or []
    charts = _trend(points, "state_rows", "state rows") + _trend(
        points, "lag_records", "Kafka lag, records"
    )
    return charts or "<p>not enough points yet (its runs and health checks record them)</p>"


def _positions(s: dict[str, Any]) -> str:
    """Per source with a position: where it reads, its lag and its kind's table (a topic's:
    each partition's committed, end and earliest offsets, lag and retention margin, negative
    where records were deleted unread), as `stateops status` shows them."""
    html = ""
    for part in s.get("positions", []):
        head = f"<h4>{_e(part['source'])}: {_e(part['where'])}"
        table = part.get("table")
        if table is None:
            css = ' class="error"' if part["committed"] is not None else ""
            html += f"{head}</h4><p{css}>{_e(part['said'])}</p>"
            continue
        html += f"{head}, {_e(part['said'])}</h4>" + _rows(table["columns"], table["rows"])
    return f"<h3>Sources</h3>{html}" if html else ""


def _query_card(s: dict[str, Any]) -> str:
    last = s["last_committed_batch"]
    facts = [
        ["source", s["inputs"]],
        ["checkpoint", s["checkpoint"]],
        ["last committed batch", "none yet" if last is None else f"{last} at {s['committed_at']}"],
    ]
    if s.get("holder"):
        facts.append(["held by", describe_holder(s["holder"])])
    if s["last_run"]:
        r = s["last_run"]
        facts.append(["last run", f"{r['operation']} {r['status']} at {r['started_at']}"])
    facts.append(["last cleanup", describe_cleanup(s["last_cleanup"])])
    operators = "".join(
        f"<h4>operator {op['operator_id']}: {_e(op['operator_name'])}</h4>"
        + _rows(
            ["partitions", "state rows", "as of batch", "bytes"],
            [
                [
                    op["partitions"],
                    op["state_rows"],
                    op["rows_as_of_batch"],
                    format_bytes(op["bytes"]),
                ]
            ],
        )
        + "<p>bytes per snapshot group</p>"
        + _chart(op["snapshot_groups"])
        for op in s["operators"]
    )
    v = s["last_validation"]
    if v:
        docs = (
            f' <a href="docs/{_e(s["query"])}/index.html" target="_blank">Data Docs</a>'
            if v["data_docs"]
            else ""
        )
        rows = ", ".join(f"{k}: {x['rows']} rows" for k, x in v["variables"].items())
        validation = (
            f'<p class="{"ok" if v["ok"] else "error"}">batch {v["batch_id"]}: '
            f"{'passed' if v['ok'] else 'FAILED'} ({_e(rows)}){docs}</p>"
        )
    else:
        validation = "<p>none</p>"
    h = s["health"]
    verdict = f'<p class="verdict {h["verdict"].lower()}"><b>{h["verdict"]}</b></p>' + "".join(
        f"<p>{_e(r)}</p>" for r in h["reasons"]
    )
    # Links into Airflow (the view is at <base>/stateops/): its runs and its trigger forms.
    links = (
        "<p>"
        + " · ".join(
            f'<a href="../dags/{dag}{page}" target="_top">{label}</a>'
            for label, dag, page in (
                ("runs", "stream_start", "/runs"),
                ("backfill", "stream_backfill", ""),
                ("migrate", "stream_source_migration", ""),
                ("upgrade code", "stream_code_upgrade", ""),
                ("restore", "stream_restore", ""),
                ("repartition", "stream_repartition", ""),
            )
        )
        + "</p>"
    )
    errors = "".join(f'<p class="error">{_e(e)}</p>' for e in s["errors"])
    return (
        f'<section id="query-{_e(s["query"])}"><h2>{_e(s["query"])}</h2>{verdict}{errors}'
        + links
        + _rows([], facts)
        + _positions(s)
        + f"<h3>State</h3>{operators or '<p>no state yet</p>'}"
        + f"<h3>Over time</h3>{_history(s)}"
        + "<h3>Backups</h3>"
        + _rows(
            ["backup", "batch", "size", "files", "created", "restore drill"],
            [
                [
                    b["backup_id"],
                    b["batch_id"],
                    format_bytes(b["bytes"]),
                    b["files"],
                    b["created_at"],
                    describe_drill(b["drill"]),
                ]
                for b in reversed(s["backups"])
            ],
        )
        + f"<h3>Last validation</h3>{validation}"
        + "<h3>Lineage</h3>"
        + _rows(
            ["time", "operation", "result", "run", "checkpoint"],
            [
                [r["time"], r["operation"], r["result"], r["run_id"], Path(r["checkpoint"]).name]
                for r in s["lineage"]
            ],
        )
        + "</section>"
    )


# The view sits in an iframe of Airflow's UI: it takes Airflow's light or dark theme (the
# "dark" class next-themes puts on the UI's <html>, followed as it changes; the system's
# preference when opened on its own) and reloads itself every 30 seconds.
_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="30">
<title>Streaming state</title><style>
:root {{ --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --bg: #ffffff; --ok: #1a7f37;
  --warn: #9a6700; --fail: #cf222e; --bar: #3b82f6; color-scheme: light; }}
html.dark {{ --fg: #e6edf3; --muted: #9198a1; --line: #3d444d; --bg: #0d1117; --ok: #3fb950;
  --warn: #d29922; --fail: #f85149; --bar: #58a6ff; color-scheme: dark; }}
body {{ font: 14px system-ui, sans-serif; margin: 16px; color: var(--fg); background: var(--bg); }}
a {{ color: var(--bar); }}
section {{ border: 1px solid var(--line); border-radius: 6px; padding: 4px 16px 12px;
  margin: 0 0 16px; }}
table {{ border-collapse: collapse; }} td, th {{ padding: 2px 10px 2px 0; text-align: left; }}
th {{ color: var(--muted); font-weight: 600; }} .ok {{ color: var(--ok); }}
.error {{ color: var(--fail); }} .verdict.ok {{ color: var(--ok); }}
.verdict.warn {{ color: var(--warn); }} .verdict.fail {{ color: var(--fail); }}
.chart rect {{ fill: var(--bar); }} .chart text {{ font-size: 11px; fill: var(--fg); }}
.trend polyline {{ fill: none; stroke: var(--bar); stroke-width: 2; }}
.trend {{ border-bottom: 1px solid var(--line); }}
.trend text {{ font-size: 11px; fill: var(--muted); }}
figure {{ margin: 4px 0 10px; }} figcaption {{ color: var(--muted); font-size: 12px; }}
</style><script>
function theme() {{
  let dark = window.matchMedia("(prefers-color-scheme: dark)").matches;
  try {{ if (window.parent !== window) {{
    dark = window.parent.document.documentElement.classList.contains("dark"); }} }} catch (e) {{}}
  document.documentElement.classList.toggle("dark", dark);
}}
theme();
try {{ new MutationObserver(theme).observe(window.parent.document.documentElement,
  {{attributes: true, attributeFilter: ["class"]}}); }} catch (e) {{}}
</script></head><body><h1>Streaming state</h1>{body}</body></html>"""


class StateOpsUiPlugin(AirflowPlugin):
    name = "stateops_ui"
    fastapi_apps = [{"app": app, "url_prefix": "/stateops", "name": "Streaming state"}]
    # The manual DAGs' trigger forms, checked before a run is created (stateops_airflow.forms).
    fastapi_root_middlewares = [{"middleware": FormCheck, "name": "stateops trigger forms"}]
    external_views = [
        {
            "name": "Streaming state",
            "href": "stateops/",
            "destination": "nav",
            "category": "browse",
            "url_route": "streaming-state",
        }
    ]
