#!/usr/bin/env bash
# Device: runs a command under a watchdog and, should it outlive its limit, says where its threads are.
#
# For a run that may hang (2026-12-06: a table-form bench at uniform routing printed nothing for
# 250 s): runs CMD in the background; past LIMIT seconds (default 60) it records each thread's
# name, state, kernel wait channel and current syscall (/proc), and, where gdb is installed,
# every thread's backtrace; the command runs with POCKETMOE_STACK_DUMP=1 (src/stackdump.rs), so a
# SIGUSR1 makes our binaries write every thread's stack into hang.log, gdb or not (the device has
# none). Then it kills the command (NAME: the process to look at, default pocketmoe). From the repo
# root with dist/ carried:
#
#   LIMIT=90 scripts/device-hang-probe.sh OUTDIR scripts/device-run.sh exec pocketmoe bench ...
#
# Writes OUTDIR/hang.log (the command's output) and, on a hang, OUTDIR/hang-threads.txt. Exit
# status: the command's, or 124 after a hang.
set -uo pipefail
OUTDIR="${1:?usage: scripts/device-hang-probe.sh OUTDIR CMD ARGS...}"
shift
mkdir -p "$OUTDIR"
limit="${LIMIT:-60}"
POCKETMOE_STACK_DUMP=1 "$@" > "$OUTDIR/hang.log" 2>&1 &
pid=$!
for _ in $(seq 1 "$limit"); do
  kill -0 "$pid" 2> /dev/null || { wait "$pid"; exit $?; }
  sleep 1
done
# The process to look at: the newest named NAME (default pocketmoe: device-run.sh runs it
# through a pipe), else the deepest first descendant.
target=$(pgrep -n -x "${NAME:-pocketmoe}")
if [ -z "$target" ]; then
  target=$pid
  while child=$(pgrep -P "$target" | head -1) && [ -n "$child" ]; do target=$child; done
fi
{
  echo "== hang after ${limit} s: pid $target ($(cat /proc/"$target"/comm 2> /dev/null))"
  for t in /proc/"$target"/task/*; do
    printf '%s %s state=%s wchan=%s syscall=%s\n' "$(basename "$t")" "$(cat "$t/comm")" \
      "$(awk '{print $3}' "$t/stat")" "$(cat "$t/wchan" 2> /dev/null)" \
      "$(cut -d' ' -f1 "$t/syscall" 2> /dev/null)"
  done
  kill -USR1 "$target" 2> /dev/null && sleep 15 && echo "(SIGUSR1 sent: every thread's stack is in hang.log)"
  if command -v gdb > /dev/null; then
    gdb -p "$target" -batch -ex 'thread apply all bt 25' 2>&1 | grep -v '^\[New LWP'
  else
    echo "(no gdb here: no backtraces)"
  fi
} > "$OUTDIR/hang-threads.txt" 2>&1
kill -- "$pid" 2> /dev/null
pkill -P "$pid" 2> /dev/null
kill "$target" 2> /dev/null
sleep 1
kill -9 "$target" 2> /dev/null
cat "$OUTDIR/hang-threads.txt"
exit 124
