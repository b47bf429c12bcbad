#!/usr/bin/env bash
# `make demo`: the short story, on Kafka (the whole lifecycle tour on files is `make tour`).
# Starts the embedded Kafka broker and S3 endpoint, produces sample page views to topic
# page-visits, runs kafka_visits (page_visits' processor on that topic) and shows the offsets
# its checkpoint holds and, once more events land, its lag; advances the topic's earliest
# offset past an old batch (delete-records, as retention would) and shows the rollback to it
# refused with the checkpoint untouched; then moves the query to topic page-visits-v2 (a
# mirror of the topic) with its state, the new topic read from the cutover time on (the
# migration drains the old topic, transplants the state, proves it on the new checkpoint's first
# batch and switches), and shows from a state export that every event was counted once.
# Then new code for it: views per user and page (stateops.pipelines.page_views, a wider key):
# the status fails it (a plain restart would drop the old state), a dry run shows the plan, and
# `stateops upgrade` rewrites the state into the new code's checkpoint at the old offsets; the
# new code reads only the records produced after it, and a state export counts every event once.
# Then one query whose checkpoint lives in the embedded S3 endpoint (SeaweedFS), Spark itself
# writing s3a://: s3_visits (page_visits on landing files, in a registry of the demo's own:
# registry.yaml keeps local checkpoints) is run, backed up (objects copied server-side: the
# backups' bucket is on the same endpoint), cleaned up, rolled back and reprocessed.
# Both servers stop at the end, on failure too.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$STATEOPS_HOME"
DATA="${STATEOPS_DATA_DIR:-$STATEOPS_HOME/data}"
export STATEOPS_DATA_DIR="$DATA"
QUERY=kafka_visits
TOPIC=page-visits
NEW_TOPIC=page-visits-v2
CUTOVER=2026-01-01T04:00:00Z  # round 2's first event time (round r: [2r, 2r + 2) h after 2026)

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
logged() {  # logged NAME COMMAND...: output to $DATA/NAME.log; on failure, its errors
  local name="$1" log="$DATA/$1.log"; shift
  if ! "$@" > "$log" 2>&1; then
    { grep -E "error|Error" "$log" || tail -20 "$log"; } | tail -15
    echo "$name failed; full log: $log" >&2; exit 1
  fi
}
run_summary() {  # the run's last JSON line as one line
  grep '^{' "$1" | tail -1 | python -c 'import json, sys; s = json.load(sys.stdin)
print("  %s: batches %s..%s, %s records read, last committed batch %s" % (s["status"],
      s["first_batch_id"], s["last_batch_id"], s.get("input_rows"), s["last_committed_batch"]))'
}
counted() {  # counted EXPORT VARIABLE PRODUCED: the sum of a state export's counts against the
  # events produced; fails where they differ
  python - "$@" <<'EOF'
import json, sys
from pathlib import Path
import pyarrow.parquet as pq
root, variable, produced = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
manifest = json.loads((root / "manifest.json").read_text())
entry = next(e for e in manifest["entries"] if e["variable"] == variable)
table = pq.read_table(root / entry["path"]).flatten()  # value: a struct of one count
counts = table.column(next(c for c in table.column_names if c.startswith("value"))).to_pylist()
print(f"  {variable} in the state: {sum(counts)} over {table.num_rows} keys; events produced:"
      f" {produced} ({'equal: none lost, none doubled' if sum(counts) == produced else 'DIFFERENT'})")
sys.exit(0 if sum(counts) == produced else 1)
EOF
}
shown() {  # lines of a command's output, indented and wrapped whole (a cut hid their advice)
  fold -s -w 110 | sed 's/^/  /'
}
digest() {  # one checksum of every file of a folder (names and bytes)
  (cd "$1" && find . -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
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

step "Registry: $QUERY reads Kafka topic $TOPIC"
stateops queries > "$DATA/queries.txt" || { cat "$DATA/queries.txt"; exit 1; }
grep -A1 "^  $QUERY " "$DATA/queries.txt"

step "Embedded Kafka broker ($STATEOPS_KAFKA_BOOTSTRAP_SERVERS) and S3 endpoint ($STATEOPS_S3_ENDPOINT_URL)"
port="${STATEOPS_KAFKA_BOOTSTRAP_SERVERS##*:}"
if python -c "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 1)" \
  "$port" 2>/dev/null; then
  echo "error: port $port is taken (a broker of \`make airflow\`?); stop it, or set" \
    "STATEOPS_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:<free port>" >&2
  exit 2
fi
# The demo's topics live on its own broker, whatever connection the shell holds.
export STATEOPS_KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:$port"
export AIRFLOW_CONN_KAFKA_DEFAULT="{\"conn_type\":\"kafka\",\"extra\":{\"bootstrap.servers\":\"$STATEOPS_KAFKA_BOOTSTRAP_SERVERS\"}}"
PIDS=()
stop_servers() {  # SIGTERM: the broker shuts down cleanly; then wait for each
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop_servers EXIT
python -m stateops.dev.kafka --dir "$DATA/kafka" --port "$port" > "$DATA/kafka.log" 2>&1 &
PIDS+=($!)
python -m stateops.dev.s3server "$DATA/s3" > "$DATA/s3.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 300); do
  grep -q "^Kafka broker" "$DATA/kafka.log" && grep -q "S3 endpoint" "$DATA/s3.log" && break
  kill -0 "${PIDS[0]}" 2>/dev/null && kill -0 "${PIDS[1]}" 2>/dev/null || break
  sleep 0.2
done
grep -q "^Kafka broker" "$DATA/kafka.log" || { tail -5 "$DATA/kafka.log"; exit 1; }
grep -q "S3 endpoint" "$DATA/s3.log" || { tail -5 "$DATA/s3.log"; exit 1; }
sed 's/^/  /' "$DATA/kafka.log" | head -1

step "Sample page views produced to $TOPIC (JSON values, the user as key, 2 partitions)"
produce() { python -m stateops.dev.sampledata --users 40 "$@" | sed 's/^/  /'; }
produce --topic "$TOPIC" --round 0 --files 4

step "stateops run $QUERY: 250 records a batch; the checkpoint holds each batch's offsets"
echo "stateops run $QUERY  (log: $DATA/run-1.log)"
logged run-1 stateops run "$QUERY"
run_summary "$DATA/run-1.log"
stateops inspect "$QUERY" | awk '/^files/ {exit} {print "  " $0}'

step "More events land on $TOPIC; stateops status shows the lag"
produce --topic "$TOPIC" --round 1 --files 1
stateops status "$QUERY" --no-backups | sed 's/^/  /'

step "Retention passes batch 1's offsets; a rollback to batch 0 would lose records: refused"
python - "$DATA/checkpoints/$QUERY" <<'EOF'
import sys
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from stateops.core.checkpoint import load_checkpoint
from stateops.core.kafka import kafka_settings, offsets_text, parse_offsets

# What batch 1 read up to: the records before it are deleted (delete-records), as a short
# retention.ms would have done.
upto = parse_offsets(load_checkpoint(sys.argv[1]).offsets[1].source_offsets[0])
admin = AdminClient(kafka_settings().client_config())
wanted = [TopicPartition(t, p, o) for t, ps in upto.items() for p, o in ps.items()]
for future in admin.delete_records(wanted).values():
    future.result()
print(f"  deleted the records before {offsets_text(upto)} (delete-records)")
EOF
before="$(digest "$DATA/checkpoints/$QUERY")"
echo "stateops rollback $QUERY --to-batch 0"
if stateops rollback "$QUERY" --to-batch 0 > "$DATA/rollback.log" 2>&1; then
  echo "error: the rollback was not refused (log: $DATA/rollback.log)" >&2
  exit 1
fi
{ grep -E "^error" "$DATA/rollback.log" || tail -1 "$DATA/rollback.log"; } | sed 's/^/  /'
after="$(digest "$DATA/checkpoints/$QUERY")"
[ "$before" = "$after" ] || { echo "error: the refused rollback changed the checkpoint" >&2; exit 1; }
echo "  the checkpoint is byte-identical (sha256 of its files: $after before and after)"

step "Migration: $QUERY moves to topic $NEW_TOPIC with its state, from the cutover $CUTOVER"
echo "$NEW_TOPIC mirrors $TOPIC (round 1 again) and goes on alone (round 2), on 3 partitions:"
produce --topic "$NEW_TOPIC" --partitions 3 --round 1 --files 1
produce --topic "$NEW_TOPIC" --round 2 --files 1
migrate=(stateops migrate "$QUERY" --new-source-format kafka --new-source-topic "$NEW_TOPIC"
  --new-source-start cutover --cutover "$CUTOVER")
echo "${migrate[*]}  (log: $DATA/migrate.log)"
logged migrate "${migrate[@]}"
grep -E "^(PLAN: migration|  cutover:|  carry-over:|$QUERY: (kafka|drained|carry-over|switched)|carry-over road|transplant done|  [0-9]+ files .* starts at batch)" \
  "$DATA/migrate.log" | shown || true
echo "stateops inspect $QUERY: the new checkpoint starts $NEW_TOPIC at the offsets of the cutover"
stateops inspect "$QUERY" | grep -E "^(checkpoint|kafka|  +batch)" | sed 's/^/  /' || true
stateops status "$QUERY" --no-backups | grep -E "kafka|$NEW_TOPIC" | sed 's/^/  /' || true

step "Every event counted once: the state's visit counts against the events produced"
logged export stateops export "$QUERY" --out "$DATA/exports/$QUERY"
# round 0 (1000) and round 1 (250) read from page-visits, round 2 (250) from page-visits-v2
# after the cutover; round 1's mirror copy on page-visits-v2 is before it.
counted "$DATA/exports/$QUERY" count $((1000 + 250 + 250))

# The new code in a registry of the demo's own (registry.yaml keeps page_visits' code): the
# query keeps its name, source and checkpoint, so its migration's switch still applies.
UP_REGISTRY="$DATA/upgrade-registry.yaml"
up() { stateops --registry "$UP_REGISTRY" "$@"; }
step "Code upgrade: $QUERY gets new code, views per user and page (a wider key)"
python - "$UP_REGISTRY" "$QUERY" <<'EOF'
import sys
from pathlib import Path
import yaml
from stateops.core.registry import load_registry

dest, name = sys.argv[1:]
raw = yaml.safe_load(load_registry().path.read_text(encoding="utf-8"))
views = "stateops.pipelines.page_views"
raw["queries"][name] |= {
    "processor": {"class": f"{views}:PageViewsProcessor", "options": {},
                  "time_mode": "None", "output_mode": "Update"},
    "key_columns": ["user_id", "page"],
    "output_schema": "user_id STRING, page STRING, views LONG",
    # the old state, page_visits' list of visited pages, counted per (user, page)
    "initial_state": {"schema": "user_id STRING, page STRING, views LONG", "unique_keys": True,
                      "mapping": f"{views}:views_from_page_visits"},
    "expectations": {"non_negative": ["views.value_views"]},
}
Path(dest).write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
print(f"  {dest}: {name} with {views}:PageViewsProcessor")
EOF
echo "stateops status $QUERY: Spark would start the new code by dropping the old state"
up status "$QUERY" --no-backups | grep -E "FAIL" | head -2 | shown || true
echo "stateops upgrade $QUERY --dry-run: what the new code does to each state variable"
up upgrade "$QUERY" --dry-run 2>&1 | grep -E "^  (state|key|operator)" | shown || true
echo "stateops upgrade $QUERY  (log: $DATA/upgrade.log)"
logged upgrade up upgrade "$QUERY"
grep -E "^$QUERY(: carry-over proven| upgraded)" "$DATA/upgrade.log" | shown || true
produce --topic "$NEW_TOPIC" --round 3 --files 1
echo "stateops run $QUERY with the new code  (log: $DATA/run-2.log)"
logged run-2 up run "$QUERY"
run_summary "$DATA/run-2.log"
logged export-2 up export "$QUERY" --out "$DATA/exports/$QUERY-upgraded"
# the 1500 the old code counted, and round 3 read by the new code
counted "$DATA/exports/$QUERY-upgraded" views $((1500 + 250))

# A registry of its own for the S3 query (registry.yaml, and so every test's registry, keeps
# local checkpoints): page_visits as s3_visits, its checkpoint in the bucket stateops-checkpoints.
S3Q=s3_visits
S3_URL=s3://stateops-checkpoints/$S3Q
S3_REGISTRY="$DATA/s3-registry.yaml"
s3q() { stateops --registry "$S3_REGISTRY" "$@"; }
# Its checkpoint lives on the demo's own endpoint (the environment's settings), whatever
# connection the shell names for checkpoints.
unset STATEOPS_CHECKPOINT_CONN_ID
s3_objects() {  # how many files the checkpoint's prefix holds (S3A's directory markers aside)
  python -c 'import sys; from stateops.core.storage import list_files, location
print(len(list_files(location(sys.argv[1]))))' "$S3_URL"
}
step "A checkpoint in S3: $S3Q on $S3_URL, Spark writing s3a:// to the embedded endpoint"
python - "$S3_REGISTRY" "$S3_URL" <<'EOF'
import sys
from pathlib import Path
import yaml
from stateops.core.registry import load_registry
from stateops.core.s3 import checkpoint_settings, parse_s3_url, s3_client

dest, url = sys.argv[1:]
raw = yaml.safe_load(load_registry().path.read_text(encoding="utf-8"))
query = raw["queries"]["page_visits"] | {
    "checkpoint": url,
    "sink": {"format": "parquet", "path": "output/s3_visits"},
    "shuffle_partitions": 2,  # half the state objects a batch writes: a shorter demo
}
raw["queries"] = {"s3_visits": query}
Path(dest).write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
bucket = parse_s3_url(url).bucket
s3_client(checkpoint_settings()).create_bucket(Bucket=bucket)
print(f"  {dest}: page_visits as s3_visits, checkpoint {url} (bucket {bucket} created)")
EOF
s3q generate --out "$DATA/landing" --round 0 --events 100 --files 6 --users 40 > /dev/null
echo "stateops --registry $S3_REGISTRY run $S3Q: 6 landing files, a batch each  (log: $DATA/s3-run.log)"
logged s3-run s3q run "$S3Q"
run_summary "$DATA/s3-run.log"
s3q inspect "$S3Q" | grep -E "^(checkpoint|batches|state)" | sed 's/^/  /' || true
echo "  $(s3_objects) objects under $S3_URL/"

step "Backup to s3://stateops-backups/$S3Q: the same endpoint, so objects are copied server-side"
logged s3-backup s3q backup "$S3Q"
grep -E "^backup b-.* uploaded" "$DATA/s3-backup.log" | sed 's/^/  /'

step "Cleanup: what restarts after the last 3 batches need is kept, the rest deleted from S3"
before="$(s3_objects)"
logged s3-cleanup s3q cleanup "$S3Q" --retain-batches 3
grep -E "^cleanup " "$DATA/s3-cleanup.log" | sed 's/^/  /'
echo "  objects under $S3_URL/: $before before, $(s3_objects) after"

to=$(( $(s3q inspect "$S3Q" --json | python -c 'import json, sys
print(json.load(sys.stdin)["last_committed_batch"])') - 2 ))
step "Rollback to batch $to (a server-side backup first) and reprocess the 2 batches after it"
echo "stateops rollback $S3Q --to-batch $to  (log: $DATA/s3-rollback.log)"
logged s3-rollback s3q rollback "$S3Q" --to-batch "$to"
grep -E "^(rollback rollback-|backup b-.* uploaded)" "$DATA/s3-rollback.log" | shown || true
echo "stateops run $S3Q  (log: $DATA/s3-rerun.log)"
logged s3-rerun s3q run "$S3Q"
run_summary "$DATA/s3-rerun.log"
s3q verify "$S3Q" | tail -1 | sed 's/^/  /'

printf '\nDemo data is in %s (kafka/ and kafka.log: the broker; s3/: the S3 endpoint'"'"'s\n' "$DATA"
echo "objects; checkpoints/, output/)."
echo "The whole lifecycle tour on file sources (Airflow DAGs, backups, restore, cleanup, backfill,"
echo "format v2, repartition, a migration to Parquet): make tour"
