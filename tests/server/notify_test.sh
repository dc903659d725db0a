#!/usr/bin/env bash
# Issue 16, point 15: a real megatraind under a stand-in for systemd's notify socket says
# READY=1 once it answers, feeds the watchdog (WATCHDOG=1 at half of WATCHDOG_USEC) and says
# STOPPING=1 on SIGTERM. Every wait is for a datagram, bounded.
source "$(dirname "$0")/daemon_test_lib.sh"

NOTIFY="$SOCKDIR/notify.sock"
python3 -u - "$NOTIFY" > "$WORK/notify.log" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
print("bound", flush=True)
while True:
    data = s.recv(4096).decode()
    print(data.replace("\n", " "), flush=True)
    if data.startswith("STOPPING=1"):
        break
PY
RECEIVER=$!
await_line() {  # await_line <seconds> <pattern>
  local deadline=$((SECONDS + $1))
  until grep -q -- "$2" "$WORK/notify.log"; do
    [ "$SECONDS" -lt "$deadline" ] || fail "no '$2' from megatraind within $1 s: $(cat "$WORK/notify.log")"
    sleep 0.1
  done
}
await_line 30 "^bound"
NOTIFY_SOCKET="$NOTIFY" WATCHDOG_USEC=400000 start_daemon
await_line 30 "^READY=1 STATUS=serving on $SOCKET"
await_line 30 "^WATCHDOG=1"
[ "$(grep -c '^WATCHDOG=1' "$WORK/notify.log")" -ge 1 ] || fail "no watchdog ping"
stop_daemon
await_line 30 "^STOPPING=1"
timeout 30 tail --pid="$RECEIVER" -f /dev/null || fail "receiver did not end"
# A malformed variable stops the start with the variable's name.
set +e
NOTIFY_SOCKET=relative.sock "$MEGATRAIND" --state_dir="$WORK/state" --socket_path="$SOCKET" \
  --data_roots="$WORK/data" --output_roots="$WORK/out" --device_arena_bytes=67108864 \
  2> "$WORK/bad.log"
rc=$?
set -e
[ "$rc" = 1 ] || fail "malformed NOTIFY_SOCKET: exit $rc"
grep -q "NOTIFY_SOCKET: 'relative.sock'" "$WORK/bad.log" || fail "$(cat "$WORK/bad.log")"
echo PASS
