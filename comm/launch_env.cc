#include "aiacc/comm/launch_env.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <optional>

#include "aiacc/comm/store.h"
#include "aiacc/common/error.h"

extern char** environ;

namespace aiacc::comm {
namespace {

const std::string* find(const EnvMap& env, const char* name) {
  const auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

bool has(const EnvMap& env, const char* name) { return find(env, name) != nullptr; }

int toInt(const std::string& v, const char* name) {
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v.c_str(), &end, 10);
  AIACC_CHECK_INPUT(end != v.c_str() && *end == '\0' && errno == 0 && x >= -1 && x < (1L << 30),
                    "environment variable ", name, "='", v, "' is not an integer");
  return static_cast<int>(x);
}

std::optional<int> intVar(const EnvMap& env, const char* name) {
  const std::string* v = find(env, name);
  if (!v) return std::nullopt;
  return toInt(*v, name);
}

// The first of `names` that is set: its value and "NAME=VALUE".
struct Found {
  int value = 0;
  std::string from;
};
std::optional<Found> firstInt(const EnvMap& env, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (auto v = intVar(env, n)) return Found{*v, strCat(n, "=", *v)};
  }
  return std::nullopt;
}

std::string valueOr(const EnvMap& env, const char* name, const std::string& fallback) {
  const std::string* v = find(env, name);
  return v ? *v : fallback;
}

// A store port of the job `id` names, the same on every rank, so that two jobs sharing a node do
// not meet on one port: kDefaultStorePort + the id modulo 1000 (a numeric id; other ids: their
// FNV-1a hash's).
int jobPort(const std::string& id) {
  uint64_t v = 0;
  bool digits = !id.empty() && id.size() <= 18;
  for (char c : id) digits = digits && c >= '0' && c <= '9';
  if (digits) {
    v = std::strtoull(id.c_str(), nullptr, 10);
  } else {
    v = 2166136261u;
    for (unsigned char c : id) v = ((v ^ c) * 16777619u) & 0xffffffffu;
  }
  return kDefaultStorePort + static_cast<int>(v % 1000);
}

// MASTER_ADDR[:MASTER_PORT] (port default 29500) into `e`; false when MASTER_ADDR is unset.
bool masterFromVars(const EnvMap& env, const char* addr, const char* port, LaunchEnv& e) {
  const std::string* a = find(env, addr);
  if (!a) return false;
  const int p = intVar(env, port).value_or(kDefaultStorePort);
  e.master = strCat(*a, ":", p);
  e.master_from = strCat(addr, "=", *a, " ", port, "=", p);
  e.master_is_default = false;
  return true;
}

// Rank, world, local rank and local size from one launcher's names; checks them.
void readWorld(const EnvMap& env, LaunchEnv& e, const char* rank, const char* world, const char* local_rank,
               const char* local_size) {
  const std::string* r = find(env, rank);
  const std::string* w = find(env, world);
  AIACC_CHECK_INPUT(r && w, r ? rank : world, " is set but ", r ? world : rank, " is not: ", sourceName(e.source),
                    " sets both");
  e.world.rank = toInt(*r, rank);
  e.world.world = toInt(*w, world);
  e.world_from = strCat(world, "=", e.world.world);
  if (auto lr = intVar(env, local_rank)) e.world.local_rank = *lr;
  if (auto ls = intVar(env, local_size)) {
    e.world.local_size = *ls;
    e.local_from = strCat(local_size, "=", *ls);
  }
  AIACC_CHECK_INPUT(e.world.world >= 1 && e.world.rank >= 0 && e.world.rank < e.world.world, rank, "=", e.world.rank,
                    " and ", world, "=", e.world.world, " from ", sourceName(e.source),
                    " are inconsistent (need 0 <= rank < world size)");
  AIACC_CHECK_INPUT(e.world.local_size >= 1 && e.world.local_size <= e.world.world && e.world.local_rank >= 0 &&
                        e.world.local_rank < e.world.local_size,
                    local_rank, "=", e.world.local_rank, " and ", local_size, "=", e.world.local_size, " from ",
                    sourceName(e.source), " are inconsistent (need 0 <= local rank < local size <= world size)");
}

// Nodes and this node's index when the launcher does not say: equal local sizes assumed.
void nodesFromLocalSize(LaunchEnv& e) {
  if (e.local_from.empty() || e.world.world % e.world.local_size != 0) return;
  if (e.nnodes == 0) e.nnodes = e.world.world / e.world.local_size;
  if (e.node_rank < 0) e.node_rank = e.world.rank / e.world.local_size;
}

bool isTrue(const std::string* v) { return v && (*v == "True" || *v == "true" || *v == "1"); }

LaunchEnv fromAiacc(const EnvMap& env) {
  LaunchEnv e;
  e.source = LaunchSource::kAiacc;
  readWorld(env, e, "AIACC_RANK", "AIACC_WORLD_SIZE", "AIACC_LOCAL_RANK", "AIACC_LOCAL_SIZE");
  e.master = valueOr(env, "AIACC_MASTER", "");
  e.master_from = "AIACC_MASTER=" + e.master;
  e.job_id = valueOr(env, "AIACC_JOB_ID", "");
  if (const std::string* m = find(env, "AIACC_MASTER_PORTS")) {
    e.master_ports = toInt(*m, "AIACC_MASTER_PORTS");
    AIACC_CHECK_INPUT(e.master_ports >= 1 && e.master_ports <= kJobPortTries, "AIACC_MASTER_PORTS=", *m,
                      " must be 1 to ", kJobPortTries, " (set by aiacc_train's launcher)");
  }
  e.agent_store = isTrue(find(env, "AIACC_LAUNCHER_STORE"));
  if (const std::string* m = find(env, "AIACC_ELASTIC_MIN_NODES")) e.min_nodes = toInt(*m, "AIACC_ELASTIC_MIN_NODES");
  nodesFromLocalSize(e);
  return e;
}

LaunchEnv fromTorchrun(const EnvMap& env) {
  LaunchEnv e;
  e.source = LaunchSource::kTorchrun;
  for (const char* n : {"WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    AIACC_CHECK_INPUT(has(env, n), "torchrun set RANK but not ", n, ": is this torch.distributed.run?");
  }
  readWorld(env, e, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  if (auto g = firstInt(env, {"GROUP_RANK"})) {
    e.node_rank = g->value;
    e.node_rank_from = g->from;
  }
  if (auto g = firstInt(env, {"GROUP_WORLD_SIZE"})) {
    e.nnodes = g->value;
    e.nodes_from = g->from;
  }
  nodesFromLocalSize(e);
  masterFromVars(env, "MASTER_ADDR", "MASTER_PORT", e);
  e.agent_store = isTrue(find(env, "TORCHELASTIC_USE_AGENT_STORE"));
  // Restarts reuse the agent's store: a new attempt must not meet the last one's keys.
  e.job_id = valueOr(env, "TORCHELASTIC_RUN_ID", "torchrun");
  e.job_key = strCat(e.job_id, "/", valueOr(env, "TORCHELASTIC_RESTART_COUNT", "0"));
  return e;
}

// Kubeflow Trainer / PyTorchJob / JobSet's PET_* variables, read by this process as the node's
// launcher (what torchrun would do with them).
LaunchEnv fromKubeflow(const EnvMap& env) {
  LaunchEnv e;
  e.source = LaunchSource::kKubeflow;
  e.per_process = false;
  if (const std::string* n = find(env, "PET_NNODES")) {
    std::string v = *n;
    const auto colon = v.find(':');
    if (colon != std::string::npos) {  // an elastic range: aiacc_train, as the node's launcher, runs it
      const int lo = toInt(v.substr(0, colon), "PET_NNODES");
      v = v.substr(colon + 1);
      const int hi = toInt(v, "PET_NNODES");
      AIACC_CHECK_INPUT(lo >= 1 && lo <= hi, "PET_NNODES=", *n, " is not MIN:MAX with 1 <= MIN <= MAX");
      if (lo != hi) e.min_nodes = lo;
    }
    e.nnodes = toInt(v, "PET_NNODES");
    e.nodes_from = "PET_NNODES=" + *n;
  }
  if (auto r = firstInt(env, {"PET_NODE_RANK", "JOB_COMPLETION_INDEX"})) {
    e.node_rank = r->value;
    e.node_rank_from = r->from;
  }
  if (const std::string* p = find(env, "PET_NPROC_PER_NODE")) {
    const bool named = *p == "auto" || *p == "cpu" || *p == "gpu";  // the count comes from the flags
    if (!named) {
      e.nproc = toInt(*p, "PET_NPROC_PER_NODE");
      e.local_from = "PET_NPROC_PER_NODE=" + *p;
    }
  }
  if (!masterFromVars(env, "PET_MASTER_ADDR", "PET_MASTER_PORT", e)) {
    masterFromVars(env, "MASTER_ADDR", "MASTER_PORT", e);
  }
  if (e.nnodes == 0) e.nnodes = 1;
  if (e.node_rank < 0) {
    AIACC_CHECK_INPUT(e.nnodes == 1, e.nodes_from,
                      " from Kubeflow but neither PET_NODE_RANK nor "
                      "JOB_COMPLETION_INDEX is set: set PET_NODE_RANK on each pod");
    e.node_rank = 0;
  }
  AIACC_CHECK_INPUT(e.nnodes >= 1 && e.node_rank >= 0 && e.node_rank < e.nnodes, e.node_rank_from, " and ",
                    e.nodes_from, " from Kubeflow are inconsistent (need 0 <= node rank < nodes)");
  AIACC_CHECK_INPUT(e.nproc >= 0, e.local_from, " from Kubeflow must be a positive count, auto, cpu or gpu");
  return e;
}

// RANK / WORLD_SIZE without torchrun's agent: a PyTorchJob pod, a JobSet, a hand-written script.
LaunchEnv fromEnv(const EnvMap& env) {
  LaunchEnv e;
  e.source = LaunchSource::kEnv;
  readWorld(env, e, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  if (auto g = firstInt(env, {"GROUP_RANK"})) {
    e.node_rank = g->value;
    e.node_rank_from = g->from;
  }
  nodesFromLocalSize(e);
  masterFromVars(env, "MASTER_ADDR", "MASTER_PORT", e);
  return e;
}

// Open MPI, MPICH/PMI: the store is MASTER_ADDR:MASTER_PORT when exported, else --master.
LaunchEnv fromMpi(const EnvMap& env, LaunchSource source, const char* rank, const char* world, const char* local_rank,
                  const char* local_size) {
  LaunchEnv e;
  e.source = source;
  readWorld(env, e, rank, world, local_rank, local_size);
  nodesFromLocalSize(e);
  const char* id_name = has(env, "OMPI_MCA_ess_base_jobid") ? "OMPI_MCA_ess_base_jobid" : "PMI_JOBID";
  const std::string* id = find(env, id_name);
  if (id) e.job_id = (source == LaunchSource::kOpenMpi ? "ompi-" : "pmi-") + *id;
  if (!masterFromVars(env, "MASTER_ADDR", "MASTER_PORT", e) && id) {
    // On one node, rank 0's store on loopback, at a port of this job (several nodes need an
    // address: app/launch_env.h says so).
    e.master = strCat("127.0.0.1:", jobPort(*id));
    e.master_from = strCat(id_name, "=", *id);
    e.master_is_default = true;
    e.master_ports = kJobPortTries;
  }
  return e;
}

// horovodrun --gloo: the store is rank 0's; its driver (HOROVOD_GLOO_RENDEZVOUS_ADDR, where
// horovodrun runs, normally the first host) is the default master host between nodes.
LaunchEnv fromHorovod(const EnvMap& env) {
  LaunchEnv e;
  e.source = LaunchSource::kHorovod;
  AIACC_CHECK_INPUT(has(env, "HOROVOD_SIZE"), "HOROVOD_RANK is set but HOROVOD_SIZE is not");
  readWorld(env, e, "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE");
  if (auto c = firstInt(env, {"HOROVOD_CROSS_RANK"})) {
    e.node_rank = c->value;
    e.node_rank_from = c->from;
  }
  if (auto c = firstInt(env, {"HOROVOD_CROSS_SIZE"})) {
    e.nnodes = c->value;
    e.nodes_from = c->from;
  }
  nodesFromLocalSize(e);
  if (!masterFromVars(env, "MASTER_ADDR", "MASTER_PORT", e)) {
    const std::string* driver = find(env, "HOROVOD_GLOO_RENDEZVOUS_ADDR");
    if (driver && e.nnodes > 1) {
      e.master = strCat(*driver, ":", kDefaultStorePort);
      e.master_from = "HOROVOD_GLOO_RENDEZVOUS_ADDR=" + *driver;
      e.master_is_default = true;
    }
  }
  return e;
}

// A Slurm job step (srun). The batch step (sbatch's script) and the extern step are not one:
// their ids are above SLURM_MAX_NORMAL_STEP_ID (0xfffffff0), or named.
bool inSlurmStep(const EnvMap& env) {
  const std::string* id = find(env, "SLURM_STEP_ID");
  if (!id) id = find(env, "SLURM_STEPID");
  if (!id) return false;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(id->c_str(), &end, 10);
  return end != id->c_str() && *end == '\0' && v < 0xfffffff0ULL;
}

// srun --mpi=pmi2 (or pmix) sets an MPI's variables beside the step's own, for the same task: the
// step's then describe it, with the per-node layout and the store's host that PMI's lack. An MPI
// launcher inside a step (mpirun's or mpiexec's daemons, which srun starts one per node) sets its
// own for other tasks than the step's: its variables describe the rank.
bool slurmStepIsTheTask(const EnvMap& env, const char* rank, const char* world) {
  if (!inSlurmStep(env) || !has(env, "SLURM_PROCID")) return false;
  const auto tasks = firstInt(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"});
  return tasks && intVar(env, "SLURM_PROCID") == intVar(env, rank) &&
         std::optional<int>(tasks->value) == intVar(env, world);
}

LaunchEnv fromSlurm(const EnvMap& env) {
  LaunchEnv e;
  e.source = LaunchSource::kSlurm;
  if (const std::string* job = find(env, "SLURM_JOB_ID")) {
    const std::string* step = find(env, "SLURM_STEP_ID");
    e.job_id = strCat("slurm-", *job, ".", step ? *step : valueOr(env, "SLURM_STEPID", "0"));
  }
  const auto world = firstInt(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"});
  AIACC_CHECK_INPUT(world.has_value(), "a Slurm job step without SLURM_STEP_NUM_TASKS or SLURM_NTASKS");
  e.world.world = world->value;
  e.world_from = world->from;
  e.world.rank = toInt(*find(env, "SLURM_PROCID"), "SLURM_PROCID");
  e.world.local_rank = intVar(env, "SLURM_LOCALID").value_or(0);
  const int node = intVar(env, "SLURM_NODEID").value_or(0);
  e.node_rank = node;
  e.node_rank_from = strCat("SLURM_NODEID=", node);
  const char* tpn_name = has(env, "SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  std::vector<int> per_node;
  if (const std::string* tpn = find(env, tpn_name)) {
    per_node = parseSlurmTasksPerNode(*tpn);
    AIACC_CHECK_INPUT(node >= 0 && node < static_cast<int>(per_node.size()), "SLURM_NODEID=", node, " but ", tpn_name,
                      "='", *tpn, "' lists ", per_node.size(), " node(s)");
    e.world.local_size = per_node[static_cast<size_t>(node)];
    e.local_from = strCat(tpn_name, "=", *tpn);
  }
  if (auto n = firstInt(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"})) {
    e.nnodes = n->value;
    e.nodes_from = n->from;
  } else if (!per_node.empty()) {
    e.nnodes = static_cast<int>(per_node.size());
    e.nodes_from = e.local_from;
  }
  AIACC_CHECK_INPUT(e.world.world >= 1 && e.world.rank >= 0 && e.world.rank < e.world.world,
                    "SLURM_PROCID=", e.world.rank, " and ", e.world_from, " from Slurm are inconsistent");
  AIACC_CHECK_INPUT(e.world.local_rank >= 0 && e.world.local_rank < e.world.local_size,
                    "SLURM_LOCALID=", e.world.local_rank, " and ",
                    e.local_from.empty() ? "its tasks per node" : e.local_from, " from Slurm are inconsistent");
  if (!masterFromVars(env, "MASTER_ADDR", "MASTER_PORT", e)) {
    const char* list_name = has(env, "SLURM_STEP_NODELIST")  ? "SLURM_STEP_NODELIST"
                            : has(env, "SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST"
                                                             : "SLURM_NODELIST";
    if (const std::string* list = find(env, list_name)) {
      // Task 0 runs on the step's first node. The port: MASTER_PORT, else one per job, so that
      // two jobs sharing a node do not meet on one port.
      const std::optional<int> given = intVar(env, "MASTER_PORT");
      e.master = strCat(firstSlurmHost(*list), ":", given.value_or(jobPort(valueOr(env, "SLURM_JOB_ID", "0"))));
      e.master_from = strCat(list_name, "=", *list);
      e.master_is_default = true;
      e.master_ports = given ? 1 : kJobPortTries;
    }
  }
  return e;
}
}  // namespace

EnvMap currentEnvironment() {
  EnvMap env;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) env.emplace(std::string(*e, static_cast<size_t>(eq - *e)), std::string(eq + 1));
  }
  return env;
}

const char* sourceName(LaunchSource s) {
  switch (s) {
    case LaunchSource::kNone: return "no launcher";
    case LaunchSource::kAiacc: return "aiacc_train's launcher";
    case LaunchSource::kTorchrun: return "torchrun";
    case LaunchSource::kKubeflow: return "Kubeflow";
    case LaunchSource::kEnv: return "the environment (PyTorchJob/JobSet)";
    case LaunchSource::kOpenMpi: return "Open MPI";
    case LaunchSource::kMpich: return "MPICH/PMI";
    case LaunchSource::kHorovod: return "horovodrun";
    case LaunchSource::kSlurm: return "the Slurm job step";
  }
  return "?";
}

LaunchEnv detectLaunch(const EnvMap& env) {
  if (has(env, "AIACC_RANK")) return fromAiacc(env);
  const bool rank_vars = has(env, "RANK") && has(env, "WORLD_SIZE");
  if (has(env, "RANK") && (has(env, "TORCHELASTIC_RUN_ID") || has(env, "TORCHELASTIC_USE_AGENT_STORE"))) {
    return fromTorchrun(env);
  }
  // A PyTorchJob with one process per pod sets both RANK/WORLD_SIZE (per process) and PET_*
  // with PET_NPROC_PER_NODE=1: the same job either way, read per process.
  const bool pet = has(env, "PET_NNODES") || has(env, "PET_NPROC_PER_NODE") || has(env, "PET_NODE_RANK");
  const std::string* pet_nproc = find(env, "PET_NPROC_PER_NODE");
  if (pet && !(rank_vars && (!pet_nproc || *pet_nproc == "1"))) return fromKubeflow(env);
  if (rank_vars) return fromEnv(env);
  if (has(env, "OMPI_COMM_WORLD_RANK") && has(env, "OMPI_COMM_WORLD_SIZE")) {
    if (slurmStepIsTheTask(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")) return fromSlurm(env);
    return fromMpi(env, LaunchSource::kOpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                   "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE");
  }
  if (has(env, "PMI_RANK") && has(env, "PMI_SIZE")) {
    if (slurmStepIsTheTask(env, "PMI_RANK", "PMI_SIZE")) return fromSlurm(env);
    return fromMpi(env, LaunchSource::kMpich, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS");
  }
  if (has(env, "HOROVOD_RANK")) return fromHorovod(env);
  if (inSlurmStep(env) && has(env, "SLURM_PROCID")) return fromSlurm(env);
  // Half of a launcher's pair (RANK without WORLD_SIZE, or the reverse; Open MPI's, PMI's): an
  // error naming the other, as PyTorch's env:// gives, not a process alone as rank 0 of 1.
  if (has(env, "RANK") || has(env, "WORLD_SIZE")) return fromEnv(env);
  if (has(env, "OMPI_COMM_WORLD_RANK") || has(env, "OMPI_COMM_WORLD_SIZE")) {
    return fromMpi(env, LaunchSource::kOpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                   "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE");
  }
  if (has(env, "PMI_RANK") || has(env, "PMI_SIZE")) {
    return fromMpi(env, LaunchSource::kMpich, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS");
  }
  LaunchEnv none;
  // A Slurm job's batch script (no job step), in an allocation of several tasks or not.
  if (has(env, "SLURM_JOB_ID") && !inSlurmStep(env)) {
    none.slurm_batch = true;
    if (auto tasks = firstInt(env, {"SLURM_NTASKS", "SLURM_NPROCS"}); tasks && tasks->value > 1) {
      none.allocated_tasks = tasks->value;
      none.allocated_from = tasks->from;
    }
  }
  return none;
}

int gpuForLocalRank(int local_rank, int visible) {
  AIACC_CHECK_INPUT(visible >= 1, "no GPU is visible to this process (check CUDA_VISIBLE_DEVICES and the "
                                  "launcher's GPU binding)");
  return local_rank % visible;
}

std::vector<int> parseSlurmTasksPerNode(const std::string& s) {
  std::vector<int> out;
  size_t i = 0;
  auto bad = [&]() { AIACC_THROW(InputError, "Slurm tasks per node '", s, "' is malformed (expected e.g. 2(x3),1)"); };
  auto number = [&]() {
    const size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    if (i == start || i - start > 6) bad();
    return std::stoi(s.substr(start, i - start));
  };
  while (i < s.size()) {
    const int count = number();
    int repeat = 1;
    if (i < s.size() && s[i] == '(') {
      if (s.compare(i, 2, "(x") != 0) bad();
      i += 2;
      repeat = number();
      if (i >= s.size() || s[i] != ')') bad();
      ++i;
    }
    if (count < 1 || repeat < 1 || out.size() + static_cast<size_t>(repeat) > 100000) bad();
    out.insert(out.end(), static_cast<size_t>(repeat), count);
    if (i < s.size()) {
      if (s[i] != ',' || i + 1 == s.size()) bad();
      ++i;
    }
  }
  if (out.empty()) bad();
  return out;
}

std::string firstSlurmHost(const std::string& nodelist) {
  std::string host;
  for (size_t i = 0; i < nodelist.size() && nodelist[i] != ','; ++i) {
    if (nodelist[i] != '[') {
      host += nodelist[i];
      continue;
    }
    const size_t close = nodelist.find(']', i);
    AIACC_CHECK_INPUT(close != std::string::npos, "Slurm node list '", nodelist, "' has an unclosed '['");
    const std::string inside = nodelist.substr(i + 1, close - i - 1);
    host += inside.substr(0, inside.find_first_of(",-"));  // the first range's first number, padding kept
    i = close;
  }
  while (!host.empty() && host.back() == ' ') host.pop_back();
  AIACC_CHECK_INPUT(!host.empty(), "Slurm node list '", nodelist, "' names no host");
  return host;
}

std::string defaultJobId(const LaunchEnv& env) {
  return env.job_id.empty() ? strCat(sourceName(env.source), ", world ", env.world.world) : env.job_id;
}

}  // namespace aiacc::comm
