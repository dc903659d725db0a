#!/usr/bin/env bash
# MpiCommunicator's collectives under mpirun with 2 and 3 ranks on loopback
# (mpi_communicator_check_main.cc checks each rank's results bit for bit).
set -euo pipefail
launch="$1"
check="$2"
for ranks in 2 3; do
  out="$(timeout 120 "${launch}" "${ranks}" "${check}" "${ranks}" 2>&1)" || {
    echo "FAIL: ${ranks} ranks:"
    echo "${out}"
    exit 1
  }
  echo "${out}"
  for ((r = 0; r < ranks; ++r)); do
    grep -q "rank ${r} of ${ranks}: all collectives exact" <<<"${out}" ||
      { echo "FAIL: rank ${r} of ${ranks} did not report"; exit 1; }
  done
done
echo PASS
