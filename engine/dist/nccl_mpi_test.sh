#!/usr/bin/env bash
# NcclCommunicator with one rank per process under mpirun (2 ranks on loopback, one GPU each, the
# ncclUniqueId over MpiCommunicator): nccl_mpi_check_main.cc checks each rank. Passes, saying
# so, when the machine has fewer GPUs than ranks (here: none).
set -euo pipefail
launch="$1"
check="$2"
ranks=2
out="$(timeout 300 "${launch}" "${ranks}" "${check}" 2>&1)" || {
  echo "FAIL: ${ranks} ranks:"
  echo "${out}"
  exit 1
}
echo "${out}"
if grep -q "skipped:" <<<"${out}"; then
  echo "SKIPPED: $(grep -m1 'skipped:' <<<"${out}")"
  exit 0
fi
for ((r = 0; r < ranks; ++r)); do
  grep -q "rank ${r} of ${ranks}: nccl collectives ok" <<<"${out}" ||
    { echo "FAIL: rank ${r} of ${ranks} did not report"; exit 1; }
done
echo PASS
