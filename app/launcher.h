// Multi-process launch: `aiacc_train --nproc N` (CPU workers) or `--gpus N` starts one worker
// process per slot, re-executing this binary with the rank in its environment:
//   AIACC_RANK, AIACC_WORLD_SIZE, AIACC_LOCAL_RANK, AIACC_LOCAL_SIZE, AIACC_MASTER (host:port).
// Multi-node: --nnodes M --node-rank K --master host:port on every node; rank = K * N + local.
// Other launchers (torchrun, Kubeflow, srun, mpirun, horovodrun): app/launch_env.h.
//
// The launcher owns its workers' lifetime. They run in one process group of their own and die
// with the launcher (PR_SET_PDEATHSIG, SIGKILL), even when it is SIGKILLed. SIGINT and SIGTERM
// are forwarded to the group (a second one, or 5 s without an end, sends SIGKILL); the launcher
// then exits 128 + the signal with a message. A worker that dies (signal or non-zero exit) ends
// the job the same way: the launcher says which rank died and how, and exits 1. Worker output
// lines reach the launcher's stdout/stderr prefixed with "[rank R] ", or go to
// LaunchSpec::log_dir/rank-R.log.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "comm/gradient_sync.h"

namespace aiacc::app {

struct LaunchSpec {
  int nproc = 1;  // workers on this node
  int nnodes = 1;
  int node_rank = 0;
  std::string master = "127.0.0.1:29500";
  std::string log_dir;  // non-empty: worker R's stdout and stderr go to log_dir/rank-R.log
  // The job's id (--job-id): its ranks claim the rendezvous store under it. Empty: a fresh id
  // for a one-node job; for several nodes one every node derives alike (node layout, master).
  std::string job_id;
};

// Runs `args` (argv of the worker command) as spec.nproc children and supervises them.
// Returns the exit code for the launcher: 0 when every worker exited 0.
int launchWorkers(const LaunchSpec& spec, const std::vector<std::string>& args);

// This process's place in the job, from AIACC_* (or MPI/Slurm) variables; nullopt when the
// process was not started as a worker.
std::optional<comm::WorldInfo> worldFromEnvironment();

// AIACC_MASTER (host:port) split; throws InputError when malformed.
std::pair<std::string, int> parseHostPort(const std::string& s);

// The address this machine (or network namespace) uses to reach `host`: the source address the
// routing table picks for it (a UDP connect, nothing sent). The address Gloo should listen on
// so that peers on the master's network reach it. Throws CommError-free InputError when the
// host cannot be resolved or reached.
std::string localAddressToward(const std::string& host);

}  // namespace aiacc::app
