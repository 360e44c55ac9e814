#include "app/launch_env.h"

#include "aiacc/common/error.h"
#include "aiacc/common/parse_number.h"

namespace aiacc::app {
namespace {

// The id the ranks claim the store under: --job-id, else the launcher's, else one every rank
// derives alike (launcher and world size).
std::string jobId(const LaunchEnv& env, const LaunchFlags& flags, const comm::WorldInfo& world) {
  if (!flags.values.job_id.empty()) return flags.values.job_id;
  LaunchEnv e = env;
  e.world = world;
  return comm::defaultJobId(e);
}

std::string hostOf(const std::string& master) { return master.substr(0, master.rfind(':')); }

[[noreturn]] void conflict(const LaunchEnv& env, const std::string& from, const std::string& flag,
                           const std::string& advice) {
  AIACC_THROW(InputError, from, " from ", sourceName(env.source), " conflicts with ", flag, ": ", advice);
}

// The store address: a launcher's own (a conflicting --master is an error), else --master, else
// the launcher's default, else --master's default.
std::string resolveMaster(const LaunchEnv& env, const LaunchFlags& flags) {
  if (!env.master.empty() && !env.master_is_default) {
    if (flags.master && *flags.master != env.master) {
      conflict(env, env.master_from, "--master " + *flags.master, "drop --master under a launcher");
    }
    return env.master;
  }
  if (flags.master) return *flags.master;
  if (!env.master.empty()) return env.master;
  return flags.values.master;
}

// --nproc / --gpus as given: (count, "--gpus N"), count 0 when neither was given.
std::pair<int, std::string> givenNproc(const LaunchFlags& f) {
  if (f.gpus) return {*f.gpus, strCat("--gpus ", *f.gpus)};
  if (f.nproc) return {*f.nproc, strCat("--nproc ", *f.nproc)};
  return {0, ""};
}

// The node-level plan: this process starts the node's workers (Kubeflow's PET_*, or an srun
// step of one task per node asked for --nproc / --gpus N).
LaunchPlan planNode(const LaunchEnv& env, const LaunchFlags& flags, int nnodes, int node_rank, int env_nproc) {
  const auto [given, flag] = givenNproc(flags);
  LaunchPlan p;
  p.source = env.source;
  LaunchSpec& s = p.spawn;
  s = flags.values;
  if (env_nproc > 0) {
    if (given > 0 && given != env_nproc) {
      conflict(env, env.local_from, flag,
               flags.gpus ? strCat("pass --gpus ", env_nproc, " or drop the count from ",
                                   env.local_from.substr(0, env.local_from.find('=')))
                          : std::string("drop --nproc under a launcher"));
    }
    s.nproc = env_nproc;
  }
  if (flags.nnodes && *flags.nnodes != nnodes) {
    conflict(env, env.nodes_from, strCat("--nnodes ", *flags.nnodes), "drop --nnodes under a launcher");
  }
  if (flags.node_rank && *flags.node_rank != node_rank) {
    conflict(env, env.node_rank_from, strCat("--node-rank ", *flags.node_rank), "drop --node-rank under a launcher");
  }
  s.nnodes = nnodes;
  s.node_rank = node_rank;
  if (s.min_nodes == 0) s.min_nodes = env.min_nodes;  // Kubeflow's PET_NNODES=MIN:MAX
  s.master = resolveMaster(env, flags);
  // A job id's port (srun's): node 0's launcher hosts the store there or at one of the next.
  if (s.master == env.master && !s.external_store) s.master_ports = env.master_ports;
  if (s.job_id.empty()) s.job_id = env.job_id;  // (the same on every node of the step)
  p.role = s.nproc * s.nnodes > 1 ? LaunchPlan::Role::kSpawn : LaunchPlan::Role::kSingle;
  return p;
}

// A Slurm batch script's process that is not the batch step itself (its parent is no slurmstepd).
bool underBatchShell(const LaunchEnv& env, const std::string& parent) {
  return env.source == LaunchSource::kNone && env.slurm_batch && parent != "slurmstepd";
}

}  // namespace

std::string batchScriptWarning(const LaunchEnv& env, const std::string& parent, bool as_step) {
  if (!underBatchShell(env, parent)) return "";
  return strCat("aiacc_train runs under its Slurm batch script's shell (", parent.empty() ? "?" : parent,
                "), not as the batch step: Slurm's signals (scancel, scancel --signal, --signal=B:...) reach the "
                "shell, and the job would stop without saving; ",
                as_step ? "it runs itself as a job step (srun) instead, which a cancel, a requeue or the job's end "
                          "stops with SIGTERM, saving (--signal=B: still reaches the shell alone); "
                        : "",
                "start it with `exec aiacc_train ...` (or `srun aiacc_train ...`) in the script");
}

JobStep srunAsJobStep(const LaunchEnv& env, const LaunchPlan& plan, const std::string& parent, const comm::EnvMap& vars,
                      const std::string& exe, const std::vector<std::string>& args, const std::string& out,
                      const std::string& err) {
  const bool this_node = plan.role == LaunchPlan::Role::kSingle ||
                         (plan.role == LaunchPlan::Role::kSpawn && plan.spawn.pick_port);
  if (!underBatchShell(env, parent) || parent != "slurm_script" || !this_node || exe.empty()) {
    return {};
  }
  const auto var = [&](const char* name) {
    const auto it = vars.find(name);
    return it == vars.end() ? std::string() : it->second;
  };
  // (A count as Slurm writes it, 1 to 999999; anything else is left to srun's default.)
  const auto count = [&](const char* name) {
    const std::string v = var(name);
    const std::optional<int> n = parseInteger<int>(v);
    return n && *n > 0 && *n < 1000000 ? v : std::string();
  };
  JobStep step;
  std::vector<std::string>& cmd = step.argv;
  cmd = {"srun", "--nodes=1", "--ntasks=1", "--overlap"};
  if (const std::string node = var("SLURMD_NODENAME"); !node.empty()) cmd.push_back("--nodelist=" + node);
  if (const std::string cpus = count("SLURM_CPUS_ON_NODE"); !cpus.empty()) cmd.push_back("--cpus-per-task=" + cpus);
  if (const std::string gpus = count("SLURM_GPUS_ON_NODE"); !gpus.empty()) cmd.push_back("--gres=gpu:" + gpus);
  if (!out.empty() || !err.empty()) {
    cmd.insert(cmd.end(), {"/bin/sh", "-c",
                           R"(o=$1; e=$2; shift 2; [ -z "$o" ] || exec >> "$o"; [ -z "$e" ] || exec 2>> "$e"; )"
                           R"(exec "$@")",
                           "sh", out, err});
  }
  cmd.push_back(exe);
  cmd.insert(cmd.end(), args.begin(), args.end());
  // (Per task or per GPU: with one task of the node's CPUs and GPUs, they would clash or shrink it.)
  for (const char* name :
       {"SLURM_CPUS_PER_GPU", "SLURM_GPUS_PER_TASK", "SLURM_TRES_PER_TASK", "SLURM_MEM_PER_GPU",
        "SLURM_NTASKS_PER_NODE", "SLURM_NTASKS_PER_SOCKET", "SLURM_NTASKS_PER_CORE", "SLURM_NTASKS_PER_GPU"}) {
    if (vars.count(name) > 0) step.unset.push_back(name);
  }
  return step;
}

LaunchPlan planLaunch(const LaunchEnv& env, const LaunchFlags& flags) {
  LaunchPlan p;
  p.source = env.source;
  if (env.source == LaunchSource::kNone) {
    // A batch script's one process in an allocation of several tasks would train alone.
    if (env.allocated_tasks > 1 && !flags.nproc && !flags.gpus && !flags.nnodes) {
      AIACC_THROW(InputError, env.allocated_from, ": this Slurm job has ", env.allocated_tasks,
                  " tasks, but aiacc_train runs here as one process (its batch script, not a job step): start a "
                  "rank per task with `srun aiacc_train ...`, or the workers itself with --nproc N (--nproc 1: one "
                  "process on purpose)");
    }
    p.spawn = flags.values;
    // One node and no --master: the launcher hosts the store at a free port and tells its workers.
    p.spawn.pick_port = !flags.master && p.spawn.nnodes == 1;
    p.role = p.spawn.nproc > 1 || p.spawn.nnodes > 1 ? LaunchPlan::Role::kSpawn : LaunchPlan::Role::kSingle;
    return p;
  }
  if (env.source == LaunchSource::kAiacc) {  // one of our own workers: our flags made the variables
    p.role = LaunchPlan::Role::kWorker;
    p.world = env.world;
    p.store.master = env.master.empty() ? flags.values.master : env.master;
    if (!env.master.empty()) p.store.ports = env.master_ports;  // (the launcher's AIACC_MASTER_PORTS)
    p.store.agent_hosted = env.agent_store;                     // node 0's launcher hosts it (AIACC_LAUNCHER_STORE)
    p.min_nodes = env.min_nodes;                                // an elastic job (AIACC_ELASTIC_MIN_NODES)
    if (!env.job_key.empty()) p.store.key_prefix += "/" + env.job_key;
    p.store.job = jobId(env, flags, p.world);
    return p;
  }
  if (!env.per_process) return planNode(env, flags, env.nnodes, env.node_rank, env.nproc);
  const auto [given, flag] = givenNproc(flags);
  // srun with one task per node and --nproc / --gpus N: each task starts its node's workers.
  if (env.source == LaunchSource::kSlurm && env.world.local_size == 1 && given > 1 && env.nnodes > 0 &&
      env.world.world == env.nnodes) {
    return planNode(env, flags, env.nnodes, env.node_rank, 0);
  }
  const std::string& local_from = env.local_from.empty() ? env.world_from : env.local_from;
  if (given > 0 && given != env.world.local_size) {
    conflict(env, local_from, flag,
             flags.gpus
                 ? strCat("under a launcher --gpus must equal its processes per node (", env.world.local_size, ")")
                 : std::string("drop --nproc under a launcher"));
  }
  if (flags.nnodes && env.nnodes > 0 && *flags.nnodes != env.nnodes) {
    conflict(env, env.nodes_from.empty() ? env.world_from + " " + local_from : env.nodes_from,
             strCat("--nnodes ", *flags.nnodes), "drop --nnodes under a launcher");
  }
  if (flags.node_rank && env.node_rank >= 0 && *flags.node_rank != env.node_rank) {
    conflict(env, env.node_rank_from.empty() ? strCat("node ", env.node_rank) : env.node_rank_from,
             strCat("--node-rank ", *flags.node_rank), "drop --node-rank under a launcher");
  }
  p.role = LaunchPlan::Role::kWorker;
  p.world = env.world;
  p.store.master = resolveMaster(env, flags);
  if (p.store.master == env.master) p.store.ports = env.master_ports;  // > 1 only for a job id's port
  p.store.agent_hosted = env.agent_store;
  if (!env.job_key.empty()) p.store.key_prefix += "/" + env.job_key;
  p.store.job = jobId(env, flags, p.world);
  // Ranks on several nodes cannot meet at a loopback address nobody chose.
  const bool several_nodes = env.nnodes > 1 || (!env.local_from.empty() && env.world.local_size < env.world.world);
  const bool chosen = flags.master || (!env.master.empty() && !env.master_is_default);
  if (several_nodes && !chosen && comm::isLoopbackHost(hostOf(p.store.master))) {
    AIACC_THROW(InputError, env.world_from, " from ", sourceName(env.source), " spans several nodes (",
                env.local_from.empty() ? env.nodes_from : env.local_from,
                "): give --master HOST:PORT of rank 0's node (or export MASTER_ADDR and MASTER_PORT to every rank)");
  }
  return p;
}

}  // namespace aiacc::app
