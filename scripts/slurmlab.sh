#!/usr/bin/env bash
# slurmlab.sh: a real single-node Slurm cluster (munged + slurmctld + slurmd, Debian's slurm-wlm
# and munge) for tests, with everything it owns under one directory: config, munge key and
# socket, state, spool, logs and pid files. Nothing in /etc, /run or /var is read or written, and
# the system's own munged/slurm (if any) are left alone.
#
#   scripts/slurmlab.sh up DIR [--cgroup] [--cpus N] [--first-job-id N] [--timeout S]
#       Starts the lab (or leaves a running one as it is) and waits until `sinfo` shows the node
#       idle (at most S seconds, default 30; then it prints the daemons' log tails and fails).
#       Prints, on stdout and nothing else, what a caller must export:
#           eval "$(scripts/slurmlab.sh up /tmp/lab)"     # sets SLURM_CONF
#       --cgroup   ProctrackType=proctrack/cgroup (cgroup.conf: CgroupPlugin=autodetect) instead
#                  of proctrack/linuxproc; needs a writable cgroup hierarchy (freezer on v1)
#       --cpus N   CPUs the node declares (default: the machine's, at least 4, so 4-task jobs run
#                  on a 2-core CI machine; SlurmdParameters=config_overrides lets it declare more)
#       --first-job-id N  FirstJobId (default 1). Labs running at the same time should differ:
#                  aiacc_train under srun meets at port 29500 + job id % 1000 and names the job
#                  by "JOBID.STEP", so job 3 of two labs would share a port (use e.g. 101, 201)
#   scripts/slurmlab.sh down DIR
#       SIGKILLs the processes of the lab's jobs (found by their environment: SLURM_JOB_ID set and
#       SLURM_CONF naming this lab's slurm.conf), cancels the jobs, stops the daemons by their pid
#       files, then kills any slurmstepd of this lab left (marked SLURMLAB_DIR=DIR). Never touches
#       other processes. Leaves DIR (logs, job output) in place. Idempotent.
#   scripts/slurmlab.sh env DIR          prints the export line again
#   scripts/slurmlab.sh status DIR       daemons, sinfo, squeue
#
# One node named after `hostname -s` (NodeAddr 127.0.0.1), partition "lab", SlurmUser=root,
# select/cons_tres with CR_CPU (jobs share the node), MpiDefault=none (srun --mpi=pmi2 / pmix
# on request), no accounting (no slurmdbd: sacct does not work; JobCompType=jobcomp/filetxt
# writes each finished job's state and exit code to DIR/log/jobcomp.txt instead), KillWait=30
# (Slurm's default). Ports: a pair derived from DIR (20000-23999), moved on while either is taken,
# so two labs, or a lab and a system Slurm (6817/6818), do not clash. `up` of a stopped lab
# starts with a clean controller state (job ids from 1 again).
#
# Needs root (SlurmUser=root; slurmd runs jobs as their users). DIR's path must be short enough
# for slurmd's step sockets (DIR/spool/d/HOST_JOB.STEP, 107 bytes at most): it says so otherwise.
set -euo pipefail

die() { echo "slurmlab: $*" >&2; exit 1; }
say() { echo "slurmlab: $*" >&2; }

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

[ $# -ge 2 ] || usage
CMD=$1; DIR_ARG=$2; shift 2
CGROUP=0; CPUS=""; FIRST_JOB_ID=1; TIMEOUT=${SLURMLAB_TIMEOUT:-30}
while [ $# -gt 0 ]; do
  case $1 in
    --cgroup) CGROUP=1 ;;
    --cpus) [ $# -ge 2 ] || die "--cpus needs a number"; CPUS=$2; shift ;;
    --first-job-id) [ $# -ge 2 ] || die "--first-job-id needs a number"; FIRST_JOB_ID=$2; shift ;;
    --timeout) [ $# -ge 2 ] || die "--timeout needs seconds"; TIMEOUT=$2; shift ;;
    *) die "unknown option '$1' (see: $0 --help)" ;;
  esac
  shift
done
for n in "${CPUS:-1}" "$FIRST_JOB_ID" "$TIMEOUT"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || die "'$n' is not a positive number"
done

DIR=$(realpath -m -- "$DIR_ARG")   # absolute; `up` creates it
CONF=$DIR/etc/slurm.conf
MUNGE_SOCKET=$DIR/run/munge.socket    # DIR/run is 0755, DIR/munge (the key) 0700
HOST=$(hostname -s 2>/dev/null || uname -n); HOST=${HOST%%.*}; [ -n "$HOST" ] || HOST=localhost
export SLURM_CONF=$CONF

# --- helpers -----------------------------------------------------------------------------------

# pid in pid file $1 if that process is alive and its command name is $2, else nothing.
live_pid() {
  local pid
  [ -s "$1" ] || return 0
  pid=$(tr -dc '0-9' < "$1")
  [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] && echo "$pid"
  return 0
}
pid_munged() { live_pid "$DIR/run/munged.pid" munged; }
pid_slurmctld() { live_pid "$DIR/run/slurmctld.pid" slurmctld; }
pid_slurmd() { live_pid "$DIR/run/slurmd.pid" slurmd; }

port_taken() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }

# TERM to all of the pids given, wait up to 10 s for them (together), then KILL what is left.
stop_pids() {
  local p i left
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    left=""; for p in "$@"; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
    [ -n "$left" ] || return 0
    sleep 0.1
  done
  say "still running after 10 s: SIGKILL to$left"
  # shellcheck disable=SC2086
  kill -KILL $left 2>/dev/null || true
}

# Processes whose environment holds the exact variable $1 (and, if given, one whose line starts
# with $2): one grep over /proc/*/environ (NUL-separated records, -z).
pids_with_env() {
  local files
  files=$(grep -lzxF -- "$1" /proc/[0-9]*/environ 2>/dev/null || true)
  [ -n "$files" ] || return 0
  # shellcheck disable=SC2086
  [ -z "${2:-}" ] || files=$(grep -lz -- "^$2" $files 2>/dev/null || true)
  printf "%s\n" "$files" | sed -n 's|^/proc/\([0-9]*\)/environ$|\1|p' | grep -vx "$$" || true
}

# This shell and its ancestors (never killed by the sweep).
ancestors() { local p=$$; while [ "$p" -gt 1 ] 2>/dev/null; do echo "$p"; p=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null || echo 1); done; }

log_tails() {
  local f
  for f in "$DIR"/log/munged.log "$DIR"/log/slurmctld.log "$DIR"/log/slurmd.log; do
    [ -s "$f" ] && { echo "--- $f (last 15 lines)"; tail -n 15 "$f"; }
  done >&2
  return 0
}

print_env() { echo "export SLURM_CONF=$CONF"; }

# --- up ----------------------------------------------------------------------------------------

write_config() {
  local cpus=$1 ctld_port=$2 d_port=$3 proctrack=proctrack/linuxproc
  [ "$CGROUP" = 1 ] && proctrack=proctrack/cgroup
  cat > "$CONF" <<EOF
# Written by scripts/slurmlab.sh up $DIR: a single-node test cluster. Rewritten on each start.
ClusterName=slurmlab
MailProg=/bin/true
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$DIR/spool/ctld
SlurmdSpoolDir=$DIR/spool/d
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$DIR/etc/plugstack.conf
ProctrackType=$proctrack
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.txt
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
FirstJobId=$FIRST_JOB_ID
KillWait=30
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=$HOST NodeAddr=127.0.0.1 NodeHostname=$HOST CPUs=$cpus State=UNKNOWN
PartitionName=lab Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  : > "$DIR/etc/plugstack.conf"
  if [ "$CGROUP" = 1 ]; then
    cat > "$DIR/etc/cgroup.conf" <<EOF
CgroupPlugin=autodetect
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
EOF
  else
    rm -f "$DIR/etc/cgroup.conf"
  fi
}

# Ports from the config of an earlier start, else derived from DIR; moved on while taken.
choose_ports() {
  local p="" i
  [ -f "$CONF" ] && p=$(sed -n 's/^SlurmctldPort=//p' "$CONF")
  [ -n "$p" ] || p=$(( 20000 + ($(printf '%s' "$DIR" | cksum | cut -d' ' -f1) % 2000) * 2 ))
  for ((i = 0; i < 100; i++)); do
    if ! port_taken "$p" && ! port_taken $((p + 1)); then echo "$p $((p + 1))"; return 0; fi
    p=$(( p + 2 )); [ "$p" -lt 24000 ] || p=20000
  done
  die "no free pair of ports in 20000-23999"
}

node_state() { sinfo -h -n "$HOST" -o %t 2>/dev/null | head -n1 || true; }

wait_idle() {
  local deadline=$(( $(date +%s) + TIMEOUT )) st=""
  while :; do
    st=$(node_state)
    case $st in idle|mix|alloc) return 0 ;; esac
    if [ "$(date +%s)" -ge "$deadline" ]; then
      log_tails
      die "node $HOST not idle after ${TIMEOUT}s (sinfo state: '${st:-no answer}'); logs in $DIR/log"
    fi
    # a daemon that died will not come back: fail now
    [ -n "$(pid_slurmctld)" ] || { log_tails; die "slurmctld exited; see $DIR/log/slurmctld.log"; }
    [ -n "$(pid_slurmd)" ] || { log_tails; die "slurmd exited; see $DIR/log/slurmd.log"; }
    sleep 0.2
  done
}

up() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (SlurmUser=root, slurmd runs jobs as their users)"
  local b
  for b in munged slurmctld slurmd sinfo ss; do
    command -v "$b" >/dev/null || die "needs $b (apt-get install -y --no-install-recommends slurm-wlm munge iproute2)"
  done
  local sock_len=$(( ${#DIR} + ${#HOST} + 31 ))   # DIR/spool/d/HOST_4294967294.4294967294
  [ "$sock_len" -le 107 ] || die "DIR '$DIR' is too long for slurmd's step sockets ($sock_len > 107 bytes): use a shorter path"

  local cpus=${CPUS:-$(nproc)} ports options
  [ -n "$CPUS" ] || [ "$cpus" -ge 4 ] || cpus=4
  options="cgroup=$CGROUP cpus=$cpus first_job_id=$FIRST_JOB_ID"
  if [ -n "$(pid_munged)" ] && [ -n "$(pid_slurmctld)" ] && [ -n "$(pid_slurmd)" ]; then
    if [ "$(cat "$DIR/etc/options" 2>/dev/null)" = "$options" ]; then wait_idle; print_env; return 0; fi
    say "lab in $DIR runs with other options ($(cat "$DIR/etc/options" 2>/dev/null)): restarting it"
    down
  fi
  # partly running (a daemon died): start again from scratch
  [ -z "$(pid_munged)$(pid_slurmctld)$(pid_slurmd)" ] || { say "lab in $DIR partly running: restarting it"; down; }

  mkdir -p "$DIR"/etc "$DIR"/munge "$DIR"/spool/ctld "$DIR"/spool/d "$DIR"/log "$DIR"/run
  chmod 0700 "$DIR"/munge
  if [ ! -s "$DIR/munge/munge.key" ]; then
    if command -v mungekey >/dev/null; then mungekey --create --keyfile="$DIR/munge/munge.key"
    else dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none; fi
    chmod 0600 "$DIR/munge/munge.key"
  fi
  ports=$(choose_ports)
  write_config "$cpus" "${ports% *}" "${ports#* }"
  echo "$options" > "$DIR/etc/options"

  # munged: --force replaces a stale socket a killed munged left behind
  rm -f "$DIR"/run/*.pid
  munged --force --key-file="$DIR/munge/munge.key" --socket="$MUNGE_SOCKET" \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
    --seed-file="$DIR/munge/munged.seed" || { log_tails; die "munged failed to start"; }
  # SLURMLAB_DIR marks the daemons and the slurmstepds they start, for `down`'s sweep
  SLURMLAB_DIR=$DIR slurmctld -c -f "$CONF" || { log_tails; die "slurmctld failed to start"; }
  SLURMLAB_DIR=$DIR slurmd -c -N "$HOST" -f "$CONF" || { log_tails; die "slurmd failed to start"; }
  local i
  for ((i = 0; i < 50; i++)); do [ -n "$(pid_slurmctld)" ] && [ -n "$(pid_slurmd)" ] && break; sleep 0.1; done
  wait_idle
  say "up: node $HOST idle, ports ${ports% *}/${ports#* }, $( [ "$CGROUP" = 1 ] && echo proctrack/cgroup || echo proctrack/linuxproc ), logs in $DIR/log"
  print_env
}

# --- down --------------------------------------------------------------------------------------

down() {
  local jobs="" i p keep
  keep=" $(ancestors | tr '\n' ' ') "
  # Job processes first (their environment: SLURM_JOB_ID, and SLURM_CONF naming this lab), by
  # SIGKILL: `scancel` would give them SIGTERM and KillWait, and `scancel --signal=KILL` is a
  # plain cancel too (SIGTERM); with proctrack/linuxproc a process whose parent died escapes it.
  kill_leftovers() {
    for p in $( { pids_with_env "SLURM_CONF=$CONF" "SLURM_JOB_ID="; [ "${1:-}" = jobs ] || pids_with_env "SLURMLAB_DIR=$DIR"; } | sort -un); do
      case $keep in *" $p "*) continue ;; esac
      [ "${1:-}" = jobs ] || say "killing leftover $p: $(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | cut -c1-100)"
      kill -KILL "$p" 2>/dev/null || true
    done
  }
  kill_leftovers jobs
  if [ -n "$(pid_slurmctld)" ] && [ -f "$CONF" ]; then
    jobs=$(squeue -h -o %A 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      scancel $jobs 2>/dev/null || true
      for ((i = 0; i < 100; i++)); do [ -z "$(squeue -h -o %A 2>/dev/null || true)" ] && break; sleep 0.1; done
    fi
  fi
  # shellcheck disable=SC2046
  stop_pids $(pid_slurmd) $(pid_slurmctld) $(pid_munged)
  rm -f "$DIR"/run/*.pid
  kill_leftovers   # this lab's slurmstepds (SLURMLAB_DIR) and any job process started meanwhile
  return 0
}

status() {
  echo "munged: $(pid_munged)  slurmctld: $(pid_slurmctld)  slurmd: $(pid_slurmd)"
  if [ -n "$(pid_slurmctld)" ]; then sinfo; squeue; fi
}

case $CMD in
  up) up ;;
  down) down; say "down: $DIR" ;;
  env) print_env ;;
  status) status ;;
  -h|--help|help) usage ;;
  *) usage ;;
esac
