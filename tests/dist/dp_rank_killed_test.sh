#!/usr/bin/env bash
# A rank killed with SIGKILL mid-run makes the whole job exit non-zero within a bounded time:
# mpirun notices the lost process and aborts the other ranks (blocked in a collective), and says
# which rank died and how. Twice: the rank kills itself before a given step, and `kill -9` from
# outside once the rank says (a pid file) it is training. A rank that fails with an error instead
# (train_local, unreadable data on rank 1 only) aborts the job through MPI_Abort, naming itself.
# The bound (120 s) is far above what each takes (seconds); it only catches a hang.
set -uo pipefail
source "$(dirname "$0")/dist_test_lib.sh"
launch="$1"
worker="$2"
train="$3"
config="$4"
dir="${TEST_TMPDIR:-$(mktemp -d)}"

timeout 120 "${launch}" 3 "${worker}" "${dir}/self" 3 1000 0 1 2 >"${dir}/self.log" 2>&1
expect_aborted "self-kill" $? "${dir}/self.log"
grep -q "rank 1: SIGKILL before step 2" "${dir}/self.log" || { echo "FAIL: rank 1 did not run"; exit 1; }
grep -Eq "rank 1 .*(signal 9|Killed)" "${dir}/self.log" ||
  { echo "FAIL: mpirun did not name the killed rank"; exit 1; }
[[ ! -e "${dir}/self.rank0.weights" ]] || { echo "FAIL: rank 0 finished the run"; exit 1; }

timeout 120 "${launch}" 3 "${worker}" "${dir}/outside" 3 1000 0 2 -1 >"${dir}/outside.log" 2>&1 &
job=$!
wait_for_path -s "${dir}/outside.pid" 1200 ||
  { cat "${dir}/outside.log"; echo "FAIL: rank 2 never trained"; exit 1; }
kill -9 "$(cat "${dir}/outside.pid")"
wait "${job}"
expect_aborted "kill -9 from outside" $? "${dir}/outside.log"
grep -Eq "rank 2 .*(signal 9|Killed)" "${dir}/outside.log" ||
  { echo "FAIL: mpirun did not name the killed rank"; exit 1; }

# Rank 1 alone gets data it cannot read: it fails after MPI is up, while rank 0 waits for it.
cat >"${dir}/per_rank.sh" <<EOS
#!/usr/bin/env bash
text=/usr/share/games/fortunes
[[ "\${OMPI_COMM_WORLD_RANK}" == 1 ]] && text="${dir}/no_such_corpus"
exec "${train}" --config="${config}" --steps=4 --micro_batch=1 --seq_len=32 --accumulation=2 \
  --eval_every=0 --threads=1 --optimizer_threads=1 --arena_mb=64 --text="\${text}"
EOS
chmod +x "${dir}/per_rank.sh"
timeout 120 "${launch}" 2 "${dir}/per_rank.sh" >"${dir}/error.log" 2>&1
expect_aborted "an error on rank 1" $? "${dir}/error.log"
grep -q "error: rank 1 of 2 on host [^:]*: .*no_such_corpus" "${dir}/error.log" ||
  { echo "FAIL: rank 1's error was not printed with its rank"; exit 1; }
echo PASS
