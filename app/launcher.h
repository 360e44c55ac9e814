// Multi-process launch: `aiacc_train --nproc N` (CPU workers) or `--gpus N` starts one worker
// process per slot, re-executing this binary with the rank in its environment:
//   AIACC_RANK, AIACC_WORLD_SIZE, AIACC_LOCAL_RANK, AIACC_LOCAL_SIZE, AIACC_MASTER (host:port).
// Multi-node: --nnodes M --node-rank K --master host:port on every node; rank = K * N + local.
// Other launchers (torchrun, Kubeflow, srun, mpirun, horovodrun): app/launch_env.h.
//
// The launcher owns its workers' lifetime. They run in one process group of their own and die
// with the launcher (PR_SET_PDEATHSIG, SIGKILL), even when it is SIGKILLed.
//
// Stopping (preemption: Kubernetes' or Slurm's SIGTERM, Slurm's --signal=USR1@T warning, Ctrl-C).
// SIGINT, SIGTERM and SIGUSR1 are forwarded to the group. The first one starts the grace period
// (LaunchSpec::grace_seconds, --grace-seconds); when it runs out the group gets SIGKILL. The same
// signal a second time means SIGKILL at once; a signal of another kind is forwarded too and the
// running grace period is kept. A worker that exits kExitPreempted (75) saved a checkpoint and
// stopped; it is not a failure and does not stop the others.
//
// Exit code of the launcher: app/exit_code.h (launcherExitCode), one line on stderr for each but
// 0. A worker that fails before any signal was forwarded (another code than 0 or 75, or killed)
// ends a job of fixed size: the launcher names the rank and how it ended and stops the others
// (SIGTERM, SIGKILL after the grace period). In an elastic job the others go on without it, and
// it is started again while --max-restarts allows and the job's end is not recorded in its store.
// Worker output lines reach the launcher's stdout/stderr prefixed with "[rank R] ", or go to
// LaunchSpec::log_dir/rank-R.log.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "app/exit_code.h"
#include "aiacc/comm/gradient_sync.h"
#include "aiacc/comm/launch_env.h"

namespace aiacc::app {

// --grace-seconds: below the 30 s that Kubernetes (terminationGracePeriodSeconds) and Slurm
// (KillWait) wait between SIGTERM and SIGKILL by default, so that the launcher's SIGKILL comes first.
constexpr int kDefaultGraceSeconds = 25;
constexpr int kMaxGraceSeconds = 3600;

// Throws InputError (one line naming --grace-seconds) unless 1 <= seconds <= kMaxGraceSeconds.
void checkGraceSeconds(int seconds);

struct LaunchSpec {
  int nproc = 1;  // workers on this node
  int nnodes = 1;
  int node_rank = 0;
  std::string master = "127.0.0.1:29500";
  std::string log_dir;  // non-empty: worker R's stdout and stderr go to log_dir/rank-R.log
  // The job's id (--job-id): its ranks claim the rendezvous store under it. Empty: a fresh id
  // for a one-node job; for several nodes one every node derives alike (node layout, master).
  std::string job_id;
  // Seconds between the first forwarded stop signal (or a worker's failure) and SIGKILL.
  int grace_seconds = kDefaultGraceSeconds;
  // The worker program (execve's path; argv[0] is args[0]): this binary by default. Tests run
  // other programs (e.g. /bin/sh) through the same supervision.
  std::string executable = "/proc/self/exe";
  // Node 0's launcher hosts the rendezvous store at `master`'s port before it starts anyone, and
  // every worker (of every node) connects to it as a client (AIACC_LAUNCHER_STORE=1): the
  // rendezvous outlives any one worker, rank 0's included. aiacc_train sets it; off, rank 0 hosts.
  bool host_store = false;
  // With host_store on one node: the store takes a free port (master's is ignored), and master
  // names it to the workers, so that jobs sharing a node never meet on one port.
  bool pick_port = false;
  // With host_store: the store may be at master's port or the next master_ports - 1 (a port
  // derived from a job id, which another job on the node may hold; srun's one task per node).
  // Node 0's launcher hosts it at the first it can bind and claims it for job_id at once
  // (comm::hostJobStore), then names that port to its workers; the other nodes' workers look
  // through the ports (AIACC_MASTER_PORTS) for the store of job_id.
  int master_ports = 1;
  // The store is served outside the job (--rdzv-endpoint: aiacc_train --rendezvous-server, or any
  // TCPStore): no launcher hosts it, every worker connects to `master` as a client, and losing
  // any node, node 0 included, leaves the rendezvous standing.
  bool external_store = false;
  std::chrono::milliseconds store_timeout{60000};
  // An elastic job (--nnodes MIN:MAX; min_nodes 0: not elastic). A worker that dies no longer
  // ends its siblings: the job's ranks regroup without it (app/elastic.h), and the launcher
  // starts it again, at most max_restarts times (--max-restarts), to join the running job. The
  // launcher that hosts the store keeps it up, after its own workers ended, until the job has
  // ended (its last rank 0 says so in the store) or for rdzv_timeout.
  int min_nodes = 0;
  int max_restarts = 0;
  std::chrono::milliseconds rdzv_timeout{600000};
};

// Runs `args` (argv of the worker command) as spec.nproc children of spec.executable and supervises
// them until every one has ended. Returns the launcher's exit code (see the top of this file).
// Blocks SIGINT, SIGTERM, SIGUSR1 and SIGCHLD in the calling thread while it runs (read through a
// signalfd): call it from a process's only thread, or with those signals blocked in every other.
// Throws InputError on a bad spec (before anything starts).
int launchWorkers(const LaunchSpec& spec, const std::vector<std::string>& args);

// aiacc_train --rendezvous-server: serves a job's rendezvous store at `endpoint`'s port (every
// interface) in this process, for launchers that name it with --rdzv-endpoint, until a job it
// served says it has ended (an elastic job's last rank 0 does), or SIGTERM / SIGINT. Returns the
// exit code (0); a port in use is a CommError. Call it from the process's only thread.
int serveRendezvous(const std::string& endpoint, std::chrono::milliseconds timeout);

// This process's place in the job, from AIACC_* (or MPI/Slurm) variables; nullopt when the
// process was not started as a worker.
std::optional<comm::WorldInfo> worldFromEnvironment();

// AIACC_MASTER (host:port) split; throws InputError when malformed.
std::pair<std::string, int> parseHostPort(const std::string& s);

// The address Gloo listens on so that peers on the master's network reach it
// (comm::localAddressToward, with aiacc_train's flags in its errors).
inline std::string localAddressToward(const std::string& host) {
  return comm::localAddressToward(host, "check --master, or set --bind-host");
}

}  // namespace aiacc::app
