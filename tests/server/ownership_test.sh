#!/usr/bin/env bash
# Issue 16, point 12, against a real megatraind with real clients running as other users
# (setpriv): the daemon identifies Unix-socket callers by SO_PEERCRED, records a job's
# submitter, lets anyone read but only the submitter and admins (root, the daemon's user, the
# admin group) cancel, pause, resume, checkpoint or audit a job and purge, and writes every
# refusal into the job's audit log. Needs root (to act as other users); skipped otherwise.
source "$(dirname "$0")/daemon_test_lib.sh"

if [ "$(id -u)" != 0 ] || ! command -v setpriv > /dev/null; then
  echo "SKIP: needs root and setpriv to call the daemon as other users"
  exit 0
fi
as_user() {  # as_user <uid> <gid> <cli args...>
  local uid=$1 gid=$2
  shift 2
  setpriv --reuid="$uid" --regid="$gid" --clear-groups "$MEGATRAIN" --socket="$SOCKET" "$@"
}
expect_denied() {  # expect_denied <uid> <gid> <needle> <cli args...>
  local uid=$1 gid=$2 needle=$3
  shift 3
  set +e
  as_user "$uid" "$gid" "$@" > /dev/null 2> "$WORK/denied.txt"
  local rc=$?
  set -e
  [ "$rc" = 4 ] || fail "uid $uid '$*': expected exit 4, got $rc: $(cat "$WORK/denied.txt")"
  grep -q "PERMISSION_DENIED" "$WORK/denied.txt" || fail "not PERMISSION_DENIED: $(cat "$WORK/denied.txt")"
  grep -qF -- "$needle" "$WORK/denied.txt" || fail "refusal lacks '$needle': $(cat "$WORK/denied.txt")"
}
args="--model_config=$WORK/data/config.json --text=$WORK/data/corpus.txt --batch_size=2 --seq_len=32 --lr=1e-3"
OTHER=4242          # a user without a passwd entry: only its primary group counts
ADMIN_GROUP=nogroup # nobody's primary group
ADMIN_UID=$(id -u nobody)
ADMIN_GID=$(getent group "$ADMIN_GROUP" | cut -d: -f3)

chmod 0755 "$SOCKDIR"
start_daemon --socket_mode=0666 --admin_group="$ADMIN_GROUP" --test_hold_after_step=3
root_job=$(cli submit $args --steps=1000 --output_dir="$WORK/out/root") || fail "submit as root"
await 120 "root's job to reach its hold" step_at_least "$root_job" 3
[ "$(cli status "$root_job" --json | jq -r .submitter_uid)" = 0 ] || fail "submitter not recorded"

# Another user reads, but changes nothing of root's job; each refusal names both uids.
as_user $OTHER $OTHER status "$root_job" > /dev/null || fail "uid $OTHER cannot read"
as_user $OTHER $OTHER list > /dev/null || fail "uid $OTHER cannot list"
for action in cancel pause checkpoint resume audit; do
  expect_denied $OTHER $OTHER "submitted by uid 0" "$action" "$root_job"
  grep -qF "uid $OTHER" "$WORK/denied.txt" || fail "refusal lacks the caller: $(cat "$WORK/denied.txt")"
done
expect_denied $OTHER $OTHER "purge refused for uid $OTHER" purge --older_than_days=1
state_is "$root_job" RUNNING || fail "root's job changed after refused calls"
refusals=$(cli audit "$root_job" --json | jq '[.entries[] | select(.kind == "access_refused")] | length')
[ "$refusals" = 5 ] || fail "$refusals access_refused rows in the audit log, not 5"
cli audit "$root_job" --json | jq -e '.chain_ok == true' > /dev/null || fail "audit chain broken"

# A user's own job is theirs to change.
own=$(as_user $OTHER $OTHER submit $args --steps=2 --output_dir="$WORK/out/own") || fail "submit as $OTHER"
[ "$(cli status "$own" --json | jq -r .submitter_uid)" = $OTHER ] || fail "own job's submitter"
as_user $OTHER $OTHER pause "$own" > /dev/null || fail "uid $OTHER cannot pause its job"
as_user $OTHER $OTHER resume "$own" > /dev/null || fail "uid $OTHER cannot resume its job"
as_user $OTHER $OTHER audit "$own" > /dev/null || fail "uid $OTHER cannot audit its job"
as_user $OTHER $OTHER cancel "$own" > /dev/null || fail "uid $OTHER cannot cancel its job"

# A member of the admin group may change anyone's job.
as_user "$ADMIN_UID" "$ADMIN_GID" pause "$root_job" > /dev/null || fail "admin cannot pause"
await 120 "root's job to pause" state_is "$root_job" PAUSED
as_user "$ADMIN_UID" "$ADMIN_GID" cancel "$root_job" > /dev/null || fail "admin cannot cancel"
as_user "$ADMIN_UID" "$ADMIN_GID" purge --older_than_days=0.0000001 > "$WORK/purged.txt" ||
  fail "admin cannot purge"
grep -qx "$own" "$WORK/purged.txt" || fail "purge: $(cat "$WORK/purged.txt")"
grep -q "event=access_refused" "$WORK/daemon.log" || fail "refusals not logged"
stop_daemon
echo PASS
