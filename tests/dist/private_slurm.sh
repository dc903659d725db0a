# A private one-node Slurm cluster for a test (sourced): slurmctld and slurmd of Debian's
# slurm-wlm, as the current user, on two free loopback ports, with no authentication
# (auth/none: nothing leaves the machine), its state, spool and logs in one short directory
# (PMIx's Unix sockets must fit 108 bytes, so not under Bazel's long TEST_TMPDIR), gone when the
# test exits. `srun --mpi=pmix` then launches ranks as a site's Slurm would.
# shellcheck shell=bash

# start_private_slurm CPUS: starts the cluster with one node of CPUS CPUs (more than the machine's
# cores is allowed: it is a bound on the tasks of a step, not a pinning) and exports SLURM_CONF;
# returns once the node takes jobs (bounded wait). Stopped by stop_private_slurm (an EXIT trap).
start_private_slurm() {
  local cpus="$1" user ports ctl_port node_port host i
  for tool in slurmctld slurmd srun sinfo; do
    command -v "${tool}" >/dev/null || [[ -x "/usr/sbin/${tool}" ]] ||
      { echo "FAIL: ${tool} is not installed (scripts/setup installs slurmctld, slurmd and slurm-client)"; exit 1; }
  done
  SLURM_DIR="$(mktemp -d /tmp/mt-slurm.XXXXXX)"
  trap stop_private_slurm EXIT
  mkdir -p "${SLURM_DIR}/state" "${SLURM_DIR}/spool" "${SLURM_DIR}/tmp"
  user="$(id -un)"
  host="$(hostname -s)"
  # Two ports nothing listens on now (the kernel's choice, released at once).
  ports="$(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1", 0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))')"
  read -r ctl_port node_port <<<"${ports}"
  cat >"${SLURM_DIR}/slurm.conf" <<EOS
ClusterName=megatrain-test
SlurmctldHost=${host}(127.0.0.1)
SlurmctldPort=${ctl_port}
SlurmdPort=${node_port}
AuthType=auth/none
CredType=cred/none
SlurmUser=${user}
SlurmdUser=${user}
StateSaveLocation=${SLURM_DIR}/state
SlurmdSpoolDir=${SLURM_DIR}/spool
TmpFS=${SLURM_DIR}/tmp
SlurmctldPidFile=${SLURM_DIR}/slurmctld.pid
SlurmdPidFile=${SLURM_DIR}/slurmd.pid
SlurmctldLogFile=${SLURM_DIR}/slurmctld.log
SlurmdLogFile=${SLURM_DIR}/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/linear
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=${host} NodeAddr=127.0.0.1 CPUs=${cpus} RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=${host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOS
  export SLURM_CONF="${SLURM_DIR}/slurm.conf"
  PATH="${PATH}:/usr/sbin"
  slurmctld -D -i -f "${SLURM_CONF}" >"${SLURM_DIR}/slurmctld.out" 2>&1 &
  SLURMCTLD_PID=$!
  slurmd -D -f "${SLURM_CONF}" >"${SLURM_DIR}/slurmd.out" 2>&1 &
  SLURMD_PID=$!
  for ((i = 0; i < 600; ++i)); do
    [[ "$(sinfo -h -o %T 2>/dev/null)" == idle ]] && { echo "private Slurm: node ${host} idle"; return 0; }
    sleep 0.1
  done
  cat "${SLURM_DIR}"/*.out "${SLURM_DIR}"/*.log 2>/dev/null || true
  echo "FAIL: the private Slurm node did not become idle within 60 s"
  exit 1
}

# stop_private_slurm: ends the cluster's steps and daemons and removes its directory.
stop_private_slurm() {
  [[ -n "${SLURM_DIR:-}" ]] || return 0
  scancel --quiet --full "--user=$(id -un)" 2>/dev/null || true
  kill "${SLURMD_PID:-}" "${SLURMCTLD_PID:-}" 2>/dev/null || true
  wait "${SLURMD_PID:-}" "${SLURMCTLD_PID:-}" 2>/dev/null || true
  rm -rf "${SLURM_DIR}"
  SLURM_DIR=""
}
