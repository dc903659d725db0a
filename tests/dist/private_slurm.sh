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
  [[ ":${PATH}:" == *:/usr/sbin:* ]] || PATH="${PATH}:/usr/sbin"
  local attempt
  for attempt in 1 2 3; do
    # Two ports nothing listens on now, on any address as the daemons bind them (the kernel's
    # choice, released at once: another process may take one meanwhile, hence the attempts).
    ports="$(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("", 0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))')"
    read -r ctl_port node_port <<<"${ports}"
    rm -f "${SLURM_DIR}"/*.log "${SLURM_DIR}"/*.out
    write_private_slurm_conf "${cpus}" "${user}" "${host}" "${ctl_port}" "${node_port}"
    export SLURM_CONF="${SLURM_DIR}/slurm.conf"
    slurmctld -D -i -f "${SLURM_CONF}" >"${SLURM_DIR}/slurmctld.out" 2>&1 &
    SLURMCTLD_PID=$!
    slurmd -D -f "${SLURM_CONF}" >"${SLURM_DIR}/slurmd.out" 2>&1 &
    SLURMD_PID=$!
    for ((i = 0; i < 600; ++i)); do
      if [[ "$(sinfo -h -o %T 2>/dev/null)" == idle ]]; then
        echo "private Slurm: node ${host} idle (ports ${ctl_port}, ${node_port})"
        return 0
      fi
      grep -qs "Address already in use" "${SLURM_DIR}"/*.log "${SLURM_DIR}"/*.out && break
      # A daemon that died will not come back: try again (or give up) at once.
      kill -0 "${SLURMCTLD_PID}" 2>/dev/null && kill -0 "${SLURMD_PID}" 2>/dev/null || break
      sleep 0.1
    done
    stop_private_slurm_daemons
  done
  cat "${SLURM_DIR}"/*.out "${SLURM_DIR}"/*.log 2>/dev/null || true
  echo "FAIL: the private Slurm node did not become idle (3 attempts, 60 s each at most)"
  exit 1
}

# write_private_slurm_conf CPUS USER HOST CTL_PORT NODE_PORT: SLURM_DIR/slurm.conf.
write_private_slurm_conf() {
  local cpus="$1" user="$2" host="$3" ctl_port="$4" node_port="$5"
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
KillWait=2
NodeName=${host} NodeAddr=127.0.0.1 CPUs=${cpus} RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=${host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOS
}

# stop_private_slurm_daemons: SIGTERM to slurmd and slurmctld, SIGKILL after 10 s at most.
stop_private_slurm_daemons() {
  local pid i
  for pid in ${SLURMD_PID:-} ${SLURMCTLD_PID:-}; do
    kill "${pid}" 2>/dev/null || continue
    for ((i = 0; i < 100; ++i)); do
      kill -0 "${pid}" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "${pid}" 2>/dev/null || true
    wait "${pid}" 2>/dev/null || true
  done
  SLURMD_PID=""
  SLURMCTLD_PID=""
}

# stop_private_slurm: cancels the cluster's jobs and waits (30 s at most) until none is left, so
# no step's task outlives the test, then stops the daemons and removes the directory.
stop_private_slurm() {
  [[ -n "${SLURM_DIR:-}" ]] || return 0
  local i
  scancel --quiet --full "--user=$(id -un)" 2>/dev/null || true
  for ((i = 0; i < 300; ++i)); do
    [[ -z "$(squeue -h 2>/dev/null)" ]] && break
    sleep 0.1
  done
  stop_private_slurm_daemons
  rm -rf "${SLURM_DIR}"
  SLURM_DIR=""
}
