#!/usr/bin/env bash
# `make tour`: the whole lifecycle story on file sources (`make demo` is the short one, on Kafka),
# on the embedded defaults (local Spark, SQLite Airflow,
# SeaweedFS as S3). Generates sample events, bootstraps page_visits, runs the registered queries
# (two processors, a windowed count and a group-state session query) through the stream_start
# DAG, backs them up, lands more events, runs and backs up again (only the changes are
# uploaded), restores the first backup, and prints what each checkpoint holds;
# then many small batches, a snapshot-group cleanup, a backfill with changed logic, a twin
# of user_sessions in checkpoint format v2 cleaned and rolled back, a repartition of
# page_visits' state to 8 partitions, and a move of user_sessions to a new (Parquet) source
# with its state transplanted.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$STATEOPS_HOME"
DATA="${STATEOPS_DATA_DIR:-$STATEOPS_HOME/data}"
export STATEOPS_DATA_DIR="$DATA"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
task_log() {  # the lines of an `airflow dags test` log without the task logger's decoration
  sed -E 's/^[0-9]{4}-[0-9-]+T[0-9:.]+Z \[[a-z]+ *\] //; s/ +\[[A-Za-z0-9_.]+\] loc=[^ ]+( [a-z_]+=.*)?$//' "$1"
}
logged() {  # logged NAME COMMAND...: output to $DATA/NAME.log; on failure, its errors
  local name="$1" log="$DATA/$1.log"; shift
  if ! "$@" > "$log" 2>&1; then
    { grep -E "error|Error" "$log" || tail -20 "$log"; } | tail -15
    echo "$name failed; full log: $log" >&2; exit 1
  fi
}

# The demo owns its data folder: it starts afresh, but never wipes a folder it did not create.
# Folders and empty lock guards (what a lifecycle lock leaves, e.g. of an S3 checkpoint's
# operations under the default registry, or of an older version) are no data.
if [ -d "$DATA" ] && [ ! -f "$DATA/.demo" ] &&
  [ -n "$(find "$DATA" -mindepth 1 ! -type d ! \( -name '*.guard' -size 0 \) -print -quit)" ]; then
  echo "error: $DATA holds data the demo did not create; set STATEOPS_DATA_DIR to another folder" >&2
  exit 2
fi
rm -rf "$DATA" && mkdir -p "$DATA" && touch "$DATA/.demo"
# The tour's queries read folders: the registry without its Kafka query (`make demo` runs that
# one, with the broker its topic lives on).
python - "${STATEOPS_REGISTRY:-$STATEOPS_HOME/registry.yaml}" "$DATA/registry.yaml" <<'EOF'
import sys
import yaml
with open(sys.argv[1]) as f:
    raw = yaml.safe_load(f)
raw["queries"] = {n: q for n, q in raw["queries"].items() if q.get("source", {}).get("format") != "kafka"}
with open(sys.argv[2], "w") as f:
    yaml.safe_dump(raw, f, sort_keys=False)
EOF
export STATEOPS_REGISTRY="$DATA/registry.yaml"

step "Registry"
stateops queries
QUERIES="$(python -c 'from stateops.core.registry import load_registry; print(*load_registry().queries)')"
QUERIES_RE="${QUERIES// /|}"

step "Airflow metadata database (SQLite in $AIRFLOW_HOME)"
logged airflow-db-migrate airflow db migrate
echo "ready"

run_dag() {
  echo "airflow dags test stream_start  (log: $DATA/stream_start-$1.log)"
  logged "stream_start-$1" airflow dags test stream_start
  task_log "$DATA/stream_start-$1.log" | grep -E "^($QUERIES_RE): " | sed 's/^/  /' || true
}

step "Round 1: sample events land; page_visits is bootstrapped with pages users visited before"
stateops generate --round 0 --events 250 --files 4 --users 40 --initial-pages "$DATA/initial/page_visits.json"
conf="{\"query\": \"page_visits\", \"initial_state\": \"$DATA/initial/page_visits.json\", \"dry_run\": false}"
log="$DATA/stream_bootstrap.log"
echo "airflow dags test stream_bootstrap --conf '$conf'  (log: $log)"
logged stream_bootstrap airflow dags test stream_bootstrap --conf "$conf"
task_log "$log" | grep -E "^(page_visits: bootstrap|OK: )" | sed 's/^/  /' | sort -u || true
grep -oE "(NOT )?PROVEN: .* input \([^)]*\)" "$log" | sed 's/^/  /' || true
run_dag round1

step "Embedded S3 endpoint ($STATEOPS_S3_ENDPOINT_URL, SeaweedFS) and a backup of each query"
python -m stateops.dev.s3server "$DATA/s3" > "$DATA/s3.log" 2>&1 &
S3_PID=$!
trap 'kill "$S3_PID" 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q "S3 endpoint" "$DATA/s3.log" && break; sleep 0.2; done
grep -q "S3 endpoint" "$DATA/s3.log" || { cat "$DATA/s3.log"; exit 1; }
BACKUPS="$(python -c 'from stateops.core.registry import load_registry; print(load_registry().backups.url)')"
backup() {  # the one-line result: files, uploaded, reused (its retention's line follows it)
  stateops backup "$1" --to "$BACKUPS/$1" 2>&1 >/dev/null | grep -E "^backup b-" | tail -1 | sed 's/^/  /'
}
for q in $QUERIES; do backup "$q"; done

step "Round 2: more events land (later event times), stream_start runs again"
stateops generate --round 1 --events 250 --files 4 --users 40
run_dag round2

step "Backups again: only what round 2 changed is uploaded"
for q in $QUERIES; do backup "$q"; done
stateops backups list "$BACKUPS/page_visits" | sed 's/^/  /'
first="$(stateops backups list "$BACKUPS/page_visits" | awk 'NR == 1 {print $1}')"  # awk reads all: head would close the pipe mid-print

step "Restore page_visits' first backup into a new folder, verified"
stateops restore "$BACKUPS/page_visits/$first" --to "$DATA/restored/page_visits" 2>&1 >/dev/null \
  | sed 's/^/  /'
stateops verify "$DATA/restored/page_visits" | tail -1 | sed 's/^/  /'

step "Restart the restored page_visits (as page_visits_restored, own sink) on the same landing files"
python - "$DATA/restored/registry.yaml" <<'EOF'
import sys
import yaml
from stateops.core.registry import load_registry
raw = yaml.safe_load(load_registry().path.read_text())
query = raw["queries"]["page_visits"]
query.update(checkpoint="restored/page_visits", sink={**query["sink"], "path": "restored/output"})
raw["queries"] = {"page_visits_restored": query}
with open(sys.argv[1], "w") as f:
    yaml.safe_dump(raw, f, sort_keys=False)
EOF
echo "stateops --registry $DATA/restored/registry.yaml run page_visits_restored"
logged restart stateops --registry "$DATA/restored/registry.yaml" run page_visits_restored
grep '^{' "$DATA/restart.log" | tail -1 | python -c 'import json, sys; s = json.load(sys.stdin)
print("  %s: batches %s..%s, last committed batch %s" % (
    s["status"], s["first_batch_id"], s["last_batch_id"], s["last_committed_batch"]))'

for q in user_sessions page_visits; do
  step "stateops inspect $q"
  stateops inspect "$q"
  echo "restart after the last committed batch needs $(stateops inspect "$q" --files-for-batch \
    "$(stateops inspect "$q" --json | python -c 'import json,sys; print(json.load(sys.stdin)["last_committed_batch"])')" \
    | wc -l) of the checkpoint's files"
  step "stateops verify $q --data  (files, then Great Expectations on the state)"
  stateops verify "$q" --data 2>/dev/null
  step "audit log of $q"
  stateops audit "$q"
done

step "stateops export: page_visits' state as Parquet + manifest, live vs restored and restarted"
logged export stateops export page_visits --out "$DATA/exports/page_visits"
logged export-restored stateops --registry "$DATA/restored/registry.yaml" \
  export page_visits_restored --out "$DATA/exports/page_visits_restored"
python - "$DATA/exports" <<'EOF'
import json, sys
from pathlib import Path
live, restored = (json.loads((Path(sys.argv[1]) / name / "manifest.json").read_text())["entries"]
                  for name in ("page_visits", "page_visits_restored"))
for a, b in zip(live, restored, strict=True):
    same = (a["rows"], a["checksum"]) == (b["rows"], b["checksum"])
    print("  %s: %s rows, checksum %s; restored: %s" % (
        a["variable"], a["rows"], a["checksum"], "equal" if same else "DIFFERENT"))
    if not same:
        sys.exit("the restored query's state differs from the live query's")
EOF
echo "  manifest: $DATA/exports/page_visits/manifest.json"

step "Round 3: many small batches (one landing file each)"
stateops generate --round 2 --events 40 --files 12 --users 40
run_dag round3

last_batch() { stateops inspect "$1" --json | python -c 'import json, sys
print(json.load(sys.stdin)["last_committed_batch"])'; }
retain="$(python -c 'from stateops.core.registry import load_registry
print(load_registry().cleanup.retain_batches)')"
step "Snapshot-group cleanup: the plan first (dry run), keeping restarts after the last $retain batches"
stateops cleanup user_sessions --retain-batches "$retain" --dry-run | sed 's/^/  /'

step "airflow dags test stream_snapshot_cleanup: every query, under its lock"
declare -A size_before
for q in $QUERIES; do size_before[$q]="$(du -sk "$DATA/checkpoints/$q" | cut -f1)"; done
logged stream_snapshot_cleanup airflow dags test stream_snapshot_cleanup
task_log "$DATA/stream_snapshot_cleanup.log" | grep -oE "cleanup manual__[^ ]+ of .*" | sed "s/^/  /"
for q in $QUERIES; do
  after="$(du -sk "$DATA/checkpoints/$q" | cut -f1)"
  echo "  $q: ${size_before[$q]} KB -> $after KB on disk ($(( size_before[$q] - after )) KB saved)"
done

backfill() {  # QUERY OVERRIDES TITLE: back 3 batches, reprocessed with OVERRIDES
  local to=$(( $(last_batch "$1") - 3 ))
  local conf="{\"query\": \"$1\", \"to_batch\": $to, \"dry_run\": false, \"overrides\": $2}"
  step "Backfill: $1 back 3 batches (to $to), $3"
  echo "airflow dags test stream_backfill --conf '$conf'  (log: $DATA/stream_backfill-$1.log)"
  logged "stream_backfill-$1" airflow dags test stream_backfill --conf "$conf"
  task_log "$DATA/stream_backfill-$1.log" \
    | grep -E "^(rollback r-|$1: (succeeded|batches)|  changed |  reprocessed with )" | sed 's/^/  /'
}
backfill user_sessions '{"processor": {"options": {"session_timeout_seconds": 2700}}}' \
  "reprocessed with a 45-minute session timeout"
backfill page_counts '{"transform": {"options": {"window": "20 minutes"}}}' \
  "a transform reprocessed with 20-minute windows"

step "Checkpoint format v2 (what Spark's real-time mode needs): a twin of user_sessions in v2"
python - "$DATA/v2/registry.yaml" <<'EOF'
import sys
from pathlib import Path
import yaml
from stateops.core.registry import load_registry
raw = yaml.safe_load(load_registry().path.read_text())
query = raw["queries"]["user_sessions"]
query.update(checkpoint="v2/user_sessions", sink={**query["sink"], "path": "v2/output"},
             state_store={**query.get("state_store", {}), "checkpoint_format": 2})
raw["queries"] = {"user_sessions_v2": query}
Path(sys.argv[1]).parent.mkdir(parents=True, exist_ok=True)
with open(sys.argv[1], "w") as f:
    yaml.safe_dump(raw, f, sort_keys=False)
EOF
v2() { stateops --registry "$DATA/v2/registry.yaml" "$@"; }
echo "stateops --registry $DATA/v2/registry.yaml run user_sessions_v2  (the same landing files)"
logged v2-run v2 run user_sessions_v2
v2 inspect user_sessions_v2 | grep -E "^(format|batches) " | sed 's/^/  /'
echo "stateops cleanup user_sessions_v2 --retain-batches $retain"
v2 cleanup user_sessions_v2 --retain-batches "$retain" | tail -1 | sed 's/^/  /'
to=$(( $(v2 inspect user_sessions_v2 --json | python -c 'import json, sys
print(json.load(sys.stdin)["last_committed_batch"])') - 3 ))
echo "stateops rollback user_sessions_v2 --to-batch $to, then run again: the 3 batches reprocessed"
v2 rollback user_sessions_v2 --to-batch "$to" 2>&1 | tail -1 | sed 's/^/  /'
logged v2-rerun v2 run user_sessions_v2
v2 verify user_sessions_v2 | tail -1 | sed 's/^/  /'

step "Repartition: page_visits' state from 4 to 8 partitions by Spark's own engine, backed up first"
conf='{"query": "page_visits", "partitions": 8, "dry_run": false}'
echo "airflow dags test stream_repartition --conf '$conf'  (log: $DATA/stream_repartition.log)"
logged stream_repartition airflow dags test stream_repartition --conf "$conf"
task_log "$DATA/stream_repartition.log" | grep -oE "repartition manual__[^ ]+ of .*" | sed 's/^/  /' \
  | sort -u
stateops queries | grep -A1 "^  page_visits"

step "Source migration: user_sessions moves to a Parquet landing folder, its state transplanted"
stateops generate --round 3 --events 40 --files 2 --users 40 --out "$DATA/round4-json" >/dev/null
python - "$DATA/round4-json/user_sessions" "$DATA/landing_v2/user_sessions" <<'EOF'
import sys
from pathlib import Path
import pyarrow as pa, pyarrow.json as pj, pyarrow.parquet as pq
schema = pa.schema([("user_id", pa.string()), ("data", pa.string()), ("is_last", pa.bool_()),
                    ("event_time", pa.timestamp("us", "UTC"))])
src, dest = Path(sys.argv[1]), Path(sys.argv[2])
dest.mkdir(parents=True)
for f in sorted(src.iterdir()):
    table = pj.read_json(f, parse_options=pj.ParseOptions(explicit_schema=schema))
    pq.write_table(table, dest / (f.stem + ".parquet"))
print(f"  {len(list(dest.iterdir()))} Parquet files in {dest}")
EOF
conf='{"query": "user_sessions", "new_source_format": "parquet", "new_source_path": "landing_v2/user_sessions", "dry_run": false}'
echo "airflow dags test stream_source_migration --conf '$conf'  (log: $DATA/stream_source_migration.log)"
logged stream_source_migration airflow dags test stream_source_migration --conf "$conf"
task_log "$DATA/stream_source_migration.log" \
  | grep -E "^(carry-over road|transplant done|user_sessions: (carry-over proven|switched to|the migration goes on))" \
  | sed 's/^/  /' | sort -u
stateops queries | grep -A2 "^  user_sessions"
printf '\nDemo data is in %s (landing/, checkpoints/, output/).\n' "$DATA"
