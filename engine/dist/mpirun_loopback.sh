#!/usr/bin/env bash
# mpirun_loopback.sh RANKS PROGRAM [ARGS...]: runs PROGRAM as RANKS ranks of one MPI job on this
# machine, over loopback only, the way the tests and bench/data_parallel launch (docs/scale_out.md):
# shared memory (vader) between local ranks, TCP on lo, ORTE's out-of-band channel on lo; as root
# when we are root (containers); oversubscribed when RANKS exceeds the cores.
set -euo pipefail
ranks="$1"
shift
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Bazel's sandbox has a private, possibly unwritable HOME and TMPDIR: keep Open MPI's session
# directory in the test's temporary directory.
export TMPDIR="${TEST_TMPDIR:-${TMPDIR:-/tmp}}"
exec mpirun --oversubscribe --bind-to none -np "${ranks}" \
  --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
  "$@"
