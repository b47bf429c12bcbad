"""Where the test suite's time goes, from a recorded run (tests/suite_record.py).

    make suite-report                       # runs make test recording, then prints this
    .venv/bin/python benchmarks/suite_report.py build/suite-record [--against OLD.json]

Per tier and per module: tests, wall and CPU seconds, JVMs started, spark-submit jobs, Spark
sessions and Python worker starts; each shared world (a fixture of module or session scope:
the Kafka broker, the S3 endpoints, the Spark-written checkpoints, the Airflow stack, the
standalone cluster) with how often it was built and how long that took; the costliest tests
and function fixtures. Writes ``summary.json`` beside the record; ``--against`` an earlier one
prints each tier's and module's figures as ratios to it, so a change is held against the last.
"""

from __future__ import annotations

import argparse
import bisect
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

TIERS = ("e2e", "dag", "spark", "unit")
FIGURES = ("seconds", "cpu", "jvms", "jobs", "sessions", "py_workers")


def load(folder: Path) -> tuple[list[dict], list[tuple[float, str, str, str]]]:
    events = []
    for path in sorted(folder.glob("events-*.jsonl")):
        events += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    spawns = []
    spawn_log = folder / "spawns.log"
    for line in spawn_log.read_text().splitlines() if spawn_log.exists() else []:
        parts = line.split("\t", 3)
        try:  # a line two processes' appends interleaved is left out
            spawns.append((float(parts[0]), parts[1], parts[2], parts[3]))
        except (ValueError, IndexError):
            continue
    return events, spawns


def spawn_kind(program: str, args: str) -> str:
    """What a JVM or a Python start was: a spark-submit job (by its script), a Spark session
    in a Python process, Spark's launcher, the broker, a cluster part, a Python worker."""
    words = args.split()
    if program == "python":
        if "-m" in words[:-1]:
            module = words[words.index("-m") + 1]
            return "python daemon" if module == "pyspark.daemon" else f"python {module}"
        if not words:
            return "python"
        # A spark-submit of a .py runs it with PYSPARK_PYTHON: the job's driver process.
        script = Path(words[0]).name
        return f"python driver {script}" if "stateops/jobs/" in words[0] else f"python {script}"
    if "org.apache.spark.launcher.Main" in words:
        return "spark launcher"
    if "org.apache.spark.deploy.SparkSubmit" in words:
        script = next((Path(w).name for w in words if w.endswith(".py")), None)
        return f"job {script}" if script else "spark session"
    for main, kind in (
        ("kafka.Kafka", "kafka broker"),
        ("kafka.tools.StorageTool", "kafka format"),
        ("deploy.master.Master", "spark master"),
        ("deploy.worker.Worker", "spark worker"),
        ("CoarseGrainedExecutorBackend", "spark executor"),
        ("-version", "java -version"),
    ):
        if any(w.endswith(main) for w in words):
            return kind
    return "other jvm"


def tier_of(nodeid: str) -> str:
    folder = nodeid.split("/")[1] if nodeid.startswith("tests/") else ""
    return folder if folder in TIERS else "other"


def module_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def attribute(tests: dict[str, dict], spawns: list) -> dict[str, Counter]:
    """Each start given to the test that ran on its worker at the time ('outside tests' if
    none did: a session fixture's teardown, the controller's archive dump)."""
    per_worker: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for nodeid, t in tests.items():
        per_worker[t["worker"]].append((t["start"], t["end"], nodeid))
    for intervals in per_worker.values():
        intervals.sort()
    counts: dict[str, Counter] = defaultdict(Counter)
    for when, worker, program, args in spawns:
        intervals = per_worker.get(worker, [])
        i = bisect.bisect_right(intervals, (when, float("inf"), "")) - 1
        owner = intervals[i][2] if i >= 0 and intervals[i][1] >= when else "outside tests"
        counts[owner][spawn_kind(program, args)] += 1
    return counts


def figures(counter: Counter) -> dict[str, int]:
    jvm = sum(n for k, n in counter.items() if not k.startswith("python"))
    return {
        "jvms": jvm,
        "jobs": sum(n for k, n in counter.items() if k.startswith("python driver ")),
        "sessions": counter["spark session"],
        "py_workers": sum(
            n
            for k, n in counter.items()
            if k.startswith("python") and not k.startswith(("python driver", "python find_spark"))
        ),
    }


def summarise(events: list[dict], spawns: list) -> dict:
    tests: dict[str, dict] = {}
    for e in events:
        if e["kind"] == "test":
            tests[e["test"]] = {**e, "seconds": 0.0}
    for e in events:
        if e["kind"] == "phase" and e["test"] in tests:
            tests[e["test"]]["seconds"] += e["seconds"]
            # The test's tier is its first tier marker, as the time guard counts it.
            tests[e["test"]].setdefault("tier", (e.get("keywords") or [None])[0])
    starts = attribute(tests, spawns)
    rows = {}
    for nodeid, t in tests.items():
        rows[nodeid] = {
            "tier": t.get("tier") or tier_of(nodeid),
            "seconds": round(t["seconds"], 2),
            "cpu": t["cpu"],
            **figures(starts.get(nodeid, Counter())),
        }
    worlds: dict[str, dict] = {}
    fixture_time: dict[str, float] = defaultdict(float)
    fixture_count: Counter = Counter()
    for e in events:
        if e["kind"] == "world":
            worlds[e["name"]] = {"scope": "run", "builds": 1, "seconds": round(e["seconds"], 1)}
        if e["kind"] != "fixture" or not e["where"].startswith("tests"):
            continue
        key = f"{e['name']} ({e['where'].split('::')[0]})"
        if e["scope"] != "function":
            w = worlds.setdefault(key, {"scope": e["scope"], "builds": 0, "seconds": 0.0})
            w["builds"] += 1
            w["seconds"] = round(w["seconds"] + e["seconds"], 1)
            w["max"] = max(w.get("max", 0.0), e["seconds"])
        else:
            fixture_time[key] += e["seconds"]
            fixture_count[key] += 1
    session = next((e for e in events if e["kind"] == "session"), None)
    kinds: Counter = Counter()
    for counter in starts.values():
        kinds.update(counter)
    return {
        "wall": round(session["end"] - session["start"], 1) if session else None,
        "workers": session["workers"] if session else None,
        "tests": rows,
        "worlds": worlds,
        "function_fixtures": {
            k: {"uses": fixture_count[k], "seconds": round(v, 1)} for k, v in fixture_time.items()
        },
        "starts": dict(kinds),
        "outside_tests": figures(starts.get("outside tests", Counter())),
    }


def group(rows: dict[str, dict], key) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for nodeid, r in rows.items():
        g = out.setdefault(
            key(nodeid),
            {"tests": 0, **dict.fromkeys(FIGURES, 0)},
        )
        g["tests"] += 1
        for field in FIGURES:
            g[field] += r[field]
    return out


def _m(seconds: float) -> str:
    return f"{int(seconds // 60)}m{seconds % 60:04.1f}s"


def _ratio(new: float, old: float | None) -> str:
    return f"  x{new / old:.2f}" if old else ""


def _header(what: str, width: int, against: dict | None) -> str:
    text = f"{what:<{width}}{'tests':>6}{'time':>10}{'CPU':>10}{'JVMs':>6}{'jobs':>6}"
    text += f"{'sess':>6}{'pyw':>6}"
    return text + ("   time, CPU / before" if against else "")


def _row(label: str, width: int, g: dict, old: dict | None, against: dict | None) -> str:
    """A tier's or module's figures (sess: Spark sessions, pyw: Python worker starts), and
    with ``against``, its time and CPU as ratios to the earlier run's."""
    text = (
        f"{label:<{width}}{g['tests']:>6}{_m(g['seconds']):>10}{_m(g['cpu']):>10}"
        f"{g['jvms']:>6}{g['jobs']:>6}{g['sessions']:>6}{g['py_workers']:>6}"
    )
    if against:
        old = old or {}
        text += _ratio(g["seconds"], old.get("seconds")) or "  new"
        text += _ratio(g["cpu"], old.get("cpu"))
    return text


def report(summary: dict, against: dict | None) -> list[str]:
    rows = summary["tests"]
    old_rows = against["tests"] if against else {}
    tiers, old_tiers = (
        group(rows, lambda n: rows[n]["tier"]),
        group(old_rows, lambda n: old_rows[n]["tier"]),
    )
    modules = group(rows, module_of)
    old_modules = group(old_rows, module_of)
    out = []
    wall = summary["wall"]
    old_wall = against and against.get("wall")
    out.append(
        (f"suite wall {_m(wall)}" if wall else "suite wall unknown (the run did not finish)")
        + f" on {summary['workers'] or '?'} worker(s), {len(rows)} tests"
        + (_ratio(wall, old_wall) if wall else "")
        + (f" (was {_m(old_wall)}, {len(old_rows)} tests)" if old_wall else "")
    )
    out.append("")
    out.append(_header("tier", 8, against))
    for tier in (*TIERS, "other"):
        if tier in tiers:
            out.append(_row(tier, 8, tiers[tier], old_tiers.get(tier), against))
    outside = summary["outside_tests"]
    out.append(f"outside tests: {outside['jvms']} JVMs, {outside['py_workers']} Python starts")
    out.append("")
    out.append(
        "starts by kind: "
        + ", ".join(f"{k} {n}" for k, n in sorted(summary["starts"].items(), key=lambda kv: -kv[1]))
    )
    out.append("")
    out.append("shared worlds (fixtures of module or session scope, and the run's own)")
    out.append(f"{'world':<62}{'scope':>9}{'builds':>7}{'seconds':>9}{'max':>7}")
    for name, w in sorted(summary["worlds"].items(), key=lambda kv: -kv[1]["seconds"]):
        if w["seconds"] >= 0.5:
            out.append(
                f"{name[:61]:<62}{w['scope']:>9}{w['builds']:>7}{w['seconds']:>9.1f}"
                f"{w.get('max', w['seconds']):>7.1f}"
            )
    out.append("")
    out.append("costliest function fixtures")
    fixtures = sorted(summary["function_fixtures"].items(), key=lambda kv: -kv[1]["seconds"])
    for name, f in fixtures[:12]:
        out.append(f"  {name[:70]:<71}{f['uses']:>5} uses {f['seconds']:>8.1f} s")
    out.append("")
    out.append("modules by test time")
    out.append(_header("module", 46, against))
    for name, m in sorted(modules.items(), key=lambda kv: -kv[1]["seconds"]):
        if m["seconds"] >= 5:
            label = name.removeprefix("tests/")[:45]
            out.append(_row(label, 46, m, old_modules.get(name), against))
    out.append("")
    out.append("costliest tests")
    for nodeid, r in sorted(rows.items(), key=lambda kv: -kv[1]["seconds"])[:40]:
        name = re.sub(r"^tests/", "", nodeid)
        out.append(
            f"  {r['seconds']:>7.1f} s  cpu {r['cpu']:>6.1f}  jvm {r['jvms']:>3} "
            f"jobs {r['jobs']:>2} pyw {r['py_workers']:>3}  {name[:110]}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("record", type=Path, help="the folder STATEOPS_SUITE_RECORD named")
    parser.add_argument("--against", type=Path, help="an earlier run's summary.json")
    args = parser.parse_args(argv)
    events, spawns = load(args.record)
    if not events:
        print(f"{args.record}: no recorded test session", file=sys.stderr)
        return 2
    summary = summarise(events, spawns)
    (args.record / "summary.json").write_text(json.dumps(summary, indent=1))
    against = json.loads(args.against.read_text()) if args.against else None
    text = "\n".join(report(summary, against))
    (args.record / "report.txt").write_text(text + "\n")
    print(text)
    print(f"\n(summary: {args.record / 'summary.json'}; report: {args.record / 'report.txt'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
