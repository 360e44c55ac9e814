// Which launcher started this process, and where it puts this rank: a pure function of the
// environment (an EnvMap, so that every launcher is tested with its exact variables).
// comm::initProcessGroup (comm/process_group.h) reads it for a program; aiacc_train's
// app/launch_env.h combines it with its launch flags.
//
// Sources, in order (the first whose variables are present wins):
//   aiacc      AIACC_RANK, AIACC_WORLD_SIZE, AIACC_LOCAL_RANK, AIACC_LOCAL_SIZE, AIACC_MASTER
//              (set by aiacc_train's own launcher, --nproc / --gpus); AIACC_LAUNCHER_STORE=1
//              means node 0's launcher hosts the store at AIACC_MASTER (workers only connect),
//              or at one of the next AIACC_MASTER_PORTS - 1 ports (a Slurm job id's port)
//   torchrun   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
//              MASTER_ADDR, MASTER_PORT with TORCHELASTIC_RUN_ID; TORCHELASTIC_USE_AGENT_STORE=True
//              means the agent hosts the store at MASTER_ADDR:MASTER_PORT (workers only connect)
//   Kubeflow   PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR, PET_MASTER_PORT
//              (Kubeflow Trainer / PyTorchJob / JobSet pods, no torchrun in between): one process
//              per node, which starts the node's workers itself
//   env        RANK, WORLD_SIZE (+ LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
//              MASTER_PORT), as a PyTorchJob with one process per pod or a JobSet sets them
//   Open MPI   OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}
//   MPICH/PMI  PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS (Hydra, Intel MPI)
//   Horovod    HOROVOD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE,CROSS_RANK,CROSS_SIZE},
//              HOROVOD_GLOO_RENDEZVOUS_ADDR (horovodrun --gloo)
//   Slurm      a job step only (SLURM_STEP_ID, not the batch or extern step): SLURM_PROCID,
//              SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_TASKS_PER_NODE,
//              SLURM_STEP_NUM_NODES, SLURM_STEP_NODELIST (the master: its first host, at a port
//              of the job: 29500 + SLURM_JOB_ID % 1000). A step whose task is the MPI rank (srun
//              --mpi=pmi2 or pmix: SLURM_PROCID and the step's task count equal the MPI's rank and
//              size) is read as the Slurm step it is, before the MPI sources.
// For the MPI, Horovod and Slurm sources, MASTER_ADDR / MASTER_PORT, when set, name the store;
// else Open MPI and MPICH ranks with a job id (OMPI_MCA_ess_base_jobid, PMI_JOBID) meet on
// loopback at a port of that job (one node; several need MASTER_ADDR or --master).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "aiacc/comm/options.h"

namespace aiacc::comm {

// What the environment says. Fields a launcher does not give stay at their "unknown" value.
struct LaunchEnv {
  LaunchSource source = LaunchSource::kNone;
  // true: this process is one rank (world is filled); false (Kubeflow): this process is the
  // node's launcher and starts `nproc` workers itself.
  bool per_process = true;
  WorldInfo world;
  int nnodes = 0;  // 0: unknown
  // An elastic range's MIN nodes (Kubeflow's PET_NNODES=MIN:MAX, whose MAX is nnodes; aiacc's
  // launcher tells its workers with AIACC_ELASTIC_MIN_NODES); 0: the node count is fixed.
  int min_nodes = 0;
  int node_rank = -1;  // -1: unknown
  int nproc = 0;       // processes per node; 0: unknown (Kubeflow's "auto": from the flags)
  std::string master;  // host:port of the rendezvous store; empty: none given
  // The master came from a default of this launcher (Slurm's first host, Horovod's driver), not
  // from a variable that names the store: --master may override it.
  bool master_is_default = false;
  // The store may be at master's port or one of the next master_ports - 1
  // (StoreOptions::port_tries): master's port was derived from a job id, which another job on the
  // node may hold (kJobPortTries); 1: exactly master.
  int master_ports = 1;
  bool agent_store = false;  // the launcher's agent hosts the store at `master`: connect only
  std::string job_key;       // part of the rendezvous key prefix (torchrun: run id, restart)
  std::string job_id;        // the launcher's id of the job (torchrun run id, Slurm job.step, ...)
  // The variables behind the numbers, as NAME=VALUE, for conflict messages.
  std::string world_from, local_from, nodes_from, node_rank_from, master_from;
  // source kNone inside a Slurm job's batch script (no job step) whose allocation has several
  // tasks: their number (else 0) and the variable that says it. One process started there is
  // not a rank of a launcher: the caller says what starts the others (srun, or its own launch).
  int allocated_tasks = 0;
  std::string allocated_from;
  bool slurm_batch = false;  // source kNone inside a Slurm job's batch script (SLURM_JOB_ID, no step)
};

// Detects the launcher from `env`. Throws InputError when its variables are malformed or
// inconsistent (naming them), or incomplete: half of a pair (RANK without WORLD_SIZE, and the
// like) is an error naming the other half, not a process alone. source == kNone when no launcher
// variables are present.
LaunchEnv detectLaunch(const EnvMap& env);

// How many ports from a job id's port (29500 + the id modulo 1000) a job's store may take: 1000
// ids share 1000 ports, so two jobs on a node can meet on one (mpirun's ids are hashes; Slurm's
// count up). The one that comes second takes the next free port of its 8.
inline constexpr int kJobPortTries = 8;

// The CUDA device of a rank: local_rank % visible (with one GPU per task, CUDA_VISIBLE_DEVICES
// leaves each process one device, index 0). Throws InputError when visible < 1.
int gpuForLocalRank(int local_rank, int visible);

// Slurm's tasks-per-node list ("2(x3),1") expanded to one count per node: {2, 2, 2, 1}.
// Throws InputError when malformed.
std::vector<int> parseSlurmTasksPerNode(const std::string& s);

// The first host of a Slurm host list: "node[01-03,07],gpu5" -> "node01". Throws when empty.
std::string firstSlurmHost(const std::string& nodelist);

// The job id ranks claim the store under when nothing else names the job: the launcher's own
// (torchrun's run id, Slurm's job.step, ...), else one every rank derives alike.
std::string defaultJobId(const LaunchEnv& env);

// localhost, 127.x.x.x or ::1.
bool isLoopbackHost(const std::string& host);

// The address this machine (or network namespace) uses to reach `host`: the source address the
// routing table picks for it (a UDP connect, nothing sent), which peers on the host's network can
// reach: where Gloo listens when the store is on another machine. Throws InputError when the host
// cannot be resolved or reached; `hint` ends that message (what the caller can set instead).
std::string localAddressToward(const std::string& host,
                               const std::string& hint = "check its address, or set TransportSpec::bind_host");

// "host:port" split; `what` names the address in the error ("the store address 'x' must be
// host:port"). Throws InputError unless the host is non-empty and the port in 1..65535.
std::pair<std::string, int> parseHostPort(const std::string& s, const std::string& what = "the store address");

}  // namespace aiacc::comm
