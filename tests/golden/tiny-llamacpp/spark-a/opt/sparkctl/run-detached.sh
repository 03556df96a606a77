#!/bin/sh
# Rendered by sparkctl 0.1.0 for spark-a: profile tiny-llamacpp, rank 0 of 1.
# A detached engine: its own session, a pid file and a log file. start | stop | status
set -eu
STATE=/var/lib/sparkctl
LOG=/var/log/sparkctl/engine.log
PIDFILE="$STATE/engine.pid"
LAUNCH=/opt/sparkctl/launch.sh
STOP_TIMEOUT_S=30

alive() { [ -s "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

case "${1:-start}" in
  start)
    if alive; then echo "running $(cat "$PIDFILE")"; exit 0; fi
    mkdir -p "$STATE" "$(dirname "$LOG")"
    setsid sh "$LAUNCH" >>"$LOG" 2>&1 </dev/null &
    echo "$!" > "$PIDFILE.tmp" && mv "$PIDFILE.tmp" "$PIDFILE"
    echo "started $(cat "$PIDFILE")"
    ;;
  stop)
    if ! alive; then rm -f "$PIDFILE"; echo "stopped"; exit 0; fi
    pid=$(cat "$PIDFILE")
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    i=0
    while kill -0 "$pid" 2>/dev/null && [ "$i" -lt "$((STOP_TIMEOUT_S * 10))" ]; do sleep 0.1; i=$((i + 1)); done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    rm -f "$PIDFILE"
    echo "stopped"
    ;;
  status)
    if alive; then echo "running $(cat "$PIDFILE")"; else echo "stopped"; exit 3; fi
    ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
