# Sourced by scripts/airflow.sh and scripts/fleet.sh: the processes they start, each leading a
# session of its own (setsid), its pid in $RUN/NAME.pid and its output in $RUN/NAME.log. A
# signal goes to a whole session, not its process group: Airflow runs each task in a group of
# its own, and a task's spark-submit outlived a stop that signalled the group only.

members() {  # the live (not zombie) processes of session $1; PID 1 here may never reap zombies
  ps -eo pid=,sid=,stat= | awk -v s="$1" '$2 == s && $3 !~ /^Z/ {print $1}'
}
alive() { [ -n "$(members "$1")" ]; }
running() { [ -e "$RUN/$1.pid" ] && alive "$(cat "$RUN/$1.pid")"; }  # running NAME

start() {  # start NAME COMMAND...: in a session of its own, output to $RUN/NAME.log
  local name="$1"; shift
  setsid "$@" > "$RUN/$name.log" 2>&1 < /dev/null &
  echo $! > "$RUN/$name.pid"
}

wait_until() {  # wait_until NAME SECONDS COMMAND...: until COMMAND succeeds, while NAME lives
  local name="$1" seconds="$2"; shift 2
  for _ in $(seq "$seconds"); do
    "$@" > /dev/null 2>&1 && return 0
    if [ -e "$RUN/$name.pid" ] && ! alive "$(cat "$RUN/$name.pid")"; then break; fi
    sleep 1
  done
  echo "error: $name did not come up; the end of $RUN/$name.log:" >&2
  tail -15 "$RUN/$name.log" >&2
  exit 1
}

stop_session() {  # stop_session NAME [INT]: TERM (INT: Ctrl-C to its group, as in a terminal),
  # TERM again after 30 s, KILL after 60 s; then its pid file goes
  local name="$1" pid
  [ -e "$RUN/$name.pid" ] || return 0
  pid="$(cat "$RUN/$name.pid")"
  # (|| true: a process may end between members and kill, which then fails under set -e)
  if [ "${2:-}" = INT ]; then kill -INT -- "-$pid" 2>/dev/null || true
  else kill -TERM $(members "$pid") 2>/dev/null || true; fi
  for _ in $(seq 30); do alive "$pid" || break; sleep 1; done
  if alive "$pid"; then kill -TERM $(members "$pid") 2>/dev/null || true; fi
  for _ in $(seq 30); do alive "$pid" || break; sleep 1; done
  if alive "$pid"; then
    kill -KILL $(members "$pid") 2>/dev/null || true
    echo "$name did not stop in 60 s: killed" >&2
  fi
  rm -f "$RUN/$name.pid"
}

watch_sessions() {  # watch_sessions [NAMES]: until a stop ($RUN/stopping: exit 0) or a
  # process of ours ends (exit 1); one of NAMES (those the rest can do without) is only said,
  # once (its pid file stays: what is left of its session is stopped with the rest)
  local spare=" ${1:-} " said=" " name
  while sleep 5; do
    [ -e "$RUN/stopping" ] && { trap - EXIT; exit 0; }   # the stop command is at work
    for pidfile in "$RUN"/*.pid; do
      [ -e "$pidfile" ] || continue
      if ! kill -0 "$(cat "$pidfile" 2>/dev/null)" 2>/dev/null; then
        [ -e "$RUN/stopping" ] && { trap - EXIT; exit 0; }
        name="$(basename "$pidfile" .pid)"
        case "$said" in *" $name "*) continue ;; esac
        case "$spare" in
          *" $name "*) echo "$name stopped; the rest goes on (its log: $RUN/$name.log)" >&2
                       said="$said$name " ;;
          *) echo "$name stopped unexpectedly; logs in $RUN" >&2; exit 1 ;;
        esac
      fi
    done
  done
}
