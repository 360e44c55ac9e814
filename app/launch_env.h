// aiacc_train's launch plan: what comm::detectLaunch (comm/launch_env.h) read from the
// environment, combined with the launch flags given on the command line (--nproc, --gpus,
// --nnodes, --node-rank, --master): this process is the only rank, starts the node's workers, or is
// one worker.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "app/launcher.h"
#include "aiacc/comm/gradient_sync.h"
#include "aiacc/comm/launch_env.h"

namespace aiacc::app {

using comm::currentEnvironment;
using comm::detectLaunch;
using comm::EnvMap;
using comm::firstSlurmHost;
using comm::gpuForLocalRank;
using comm::LaunchEnv;
using comm::LaunchSource;
using comm::parseSlurmTasksPerNode;
using comm::sourceName;

// Launch flags as given on the command line: nullopt when left at the default.
struct LaunchFlags {
  std::optional<int> nproc, gpus, nnodes, node_rank;
  std::optional<std::string> master;
  // The flags' values, defaults included (nproc: --gpus N when given, else --nproc N): the plan
  // when no launcher is found. values.master is --master's value (its default when not given).
  LaunchSpec values;
};

// Where the rendezvous store is and who hosts it.
struct StoreAddress {
  std::string master;  // host:port
  // The store may be at master's port or the next ports - 1 (a port derived from the launcher's
  // job id: comm::StoreOptions::port_tries).
  int ports = 1;
  bool agent_hosted = false;  // true: every rank connects as a client (our launcher or torchrun's agent hosts it)
  std::string key_prefix = "aiacc";
  // The ranks claim the store under this id: a process of another job that reaches it is
  // refused at once (comm::StoreOptions::job).
  std::string job;
};

struct LaunchPlan {
  enum class Role { kSingle, kSpawn, kWorker };
  Role role = Role::kSingle;
  LaunchSource source = LaunchSource::kNone;
  LaunchSpec spawn;       // kSpawn: the workers this process starts on its node
  comm::WorldInfo world;  // kWorker: this process's place; kSingle: world 1
  StoreAddress store;     // kWorker
  int min_nodes = 0;      // kWorker of an elastic job: its MIN nodes (its MAX: world / local size)
};

// In a Slurm batch script, Slurm's signals (scancel, scancel --signal, --signal=B:SIG@T) go to the
// batch step's own process: the script's shell, unless it exec'ed aiacc_train (whose parent is
// then slurmstepd). Run by the shell, aiacc_train never sees them: the shell dies, and the job
// ends without its checkpoint (with proctrack/cgroup, Slurm kills every process of the batch step
// with it; with proctrack/linuxproc they would train on outside the job). So such a process starts
// itself again as a job step of its allocation (srunAsJobStep, below): a cancel, a requeue and the
// job's end stop a step's tasks with SIGTERM, and KillWait lets them save. (A signal for the batch
// step alone, --signal=B: or scancel --batch, still kills only the shell: the job then ends, and
// its step saves at that end, with the shell's exit status.) The warning to print at start for a
// process whose parent is `parent` (its name, as in /proc/PID/comm), or "" when there is none to
// give; `as_step`: it goes on as a job step (else it stops on its parent's death,
// app/stop_signal.h, which proctrack/cgroup does not leave it the time to).
std::string batchScriptWarning(const LaunchEnv& env, const std::string& parent, bool as_step);

// The job step a batch script's process starts itself again as: srun's command line (empty: none),
// and the batch's variables srun would take for options that clash with it (to unset first).
struct JobStep {
  std::vector<std::string> argv;
  std::vector<std::string> unset;
};

// srun, one task on this node (SLURMD_NODENAME) with every CPU and GPU the job has there
// (SLURM_CPUS_ON_NODE, SLURM_GPUS_ON_NODE), sharing them with any other step (--overlap), running
// `exe` with `args`. Where this process's stdout or stderr is a regular file (`out`, `err`; ""
// otherwise), the task appends to it itself (a /bin/sh that redirects, then execs): slurmstepd's
// relay of a task's output stops when the job is cancelled, and the save's lines would be lost.
// Only for a process run by the batch script's shell (slurm_script) that trains on this node
// alone (`plan`: one process, or its workers with a store at a free port): flags that name other
// nodes or a store would read differently in the step. The step's process reads the step's
// variables: it is no batch script's child, and does not do this again.
JobStep srunAsJobStep(const LaunchEnv& env, const LaunchPlan& plan, const std::string& parent, const comm::EnvMap& vars,
                      const std::string& exe, const std::vector<std::string>& args, const std::string& out,
                      const std::string& err);

// Combines the environment with the flags. Explicit flags that contradict the launcher are an
// InputError naming both, e.g. "WORLD_SIZE=4 from torchrun conflicts with --nproc 2: drop --nproc
// under a launcher". --nproc / --gpus equal to the launcher's processes per node are accepted.
// An srun step of one task per node with --nproc / --gpus N > 1 starts N workers on each node.
LaunchPlan planLaunch(const LaunchEnv& env, const LaunchFlags& flags);

}  // namespace aiacc::app
