#!/usr/bin/env bash
# A rank killed with SIGKILL mid-run makes the whole job exit non-zero within a bounded time:
# mpirun notices the lost process and aborts the other ranks (blocked in a collective), and says
# which rank died and how. The bound (120 s) is far above what it takes; it only catches a hang.
set -uo pipefail
launch="$1"
worker="$2"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
start=$SECONDS
timeout 120 "${launch}" 3 "${worker}" "${dir}/killed" 3 1000 0 1 2 >"${dir}/out" 2>&1
rc=$?
cat "${dir}/out"
echo "mpirun exited ${rc} after $((SECONDS - start)) s"
[[ ${rc} -ne 0 ]] || { echo "FAIL: the job exited 0 with a rank killed"; exit 1; }
[[ ${rc} -ne 124 ]] || { echo "FAIL: the job did not end within 120 s of a rank's death"; exit 1; }
grep -q "rank 1: SIGKILL before step 2" "${dir}/out" || { echo "FAIL: rank 1 did not run"; exit 1; }
grep -Eq "rank 1 .*(signal 9|Killed)" "${dir}/out" ||
  { echo "FAIL: mpirun did not name the killed rank"; exit 1; }
[[ ! -e "${dir}/killed.rank0.weights" ]] || { echo "FAIL: rank 0 finished the run"; exit 1; }
echo PASS
