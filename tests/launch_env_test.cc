// Launcher detection as a pure function of the environment: each launcher with the exact
// variables it sets, the plan they make with the command line's launch flags, and the conflicts.
// (Slurm's: tests/launch_env_slurm_test.cc.)
#include <gtest/gtest.h>

#include "app/launch_env.h"
#include "tests/launch_plan_test_util.h"

namespace aiacc::app {
namespace {

using launch_test::errorOf;
using launch_test::noFlags;
using Role = LaunchPlan::Role;

TEST(LaunchEnv, NothingSetIsNoLauncher) {
  const LaunchEnv e = detectLaunch({{"HOME", "/root"}, {"PATH", "/usr/bin"}});
  EXPECT_EQ(e.source, LaunchSource::kNone);
  LaunchFlags f;
  EXPECT_EQ(planLaunch(e, f).role, Role::kSingle);
  f.values.nproc = 2;
  f.nproc = 2;
  const LaunchPlan p = planLaunch(e, f);
  EXPECT_EQ(p.role, Role::kSpawn);
  EXPECT_EQ(p.spawn.nproc, 2);
}

// A rank without its world size (found by fuzz/fuzz_launch_env: the world size was read through a
// null pointer) is a one-line InputError naming both variables.
TEST(LaunchEnv, ARankWithoutItsWorldSizeIsAnError) {
  EXPECT_EQ(errorOf([] {
              detectLaunch({{"AIACC_RANK", "1"}});
            }),
            "AIACC_RANK is set but AIACC_WORLD_SIZE is not: aiacc_train's launcher sets both");
  EXPECT_EQ(errorOf([] { detectLaunch({{"HOROVOD_RANK", "1"}}); }), "HOROVOD_RANK is set but HOROVOD_SIZE is not");
  // Half of env://'s pair, or of an MPI's: it used to run alone as rank 0 of 1 (PyTorch's env://
  // refuses it too).
  for (const auto& [set, missing] :
       std::vector<std::pair<std::string, std::string>>{{"RANK", "WORLD_SIZE"},
                                                        {"WORLD_SIZE", "RANK"},
                                                        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                                        {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"},
                                                        {"PMI_RANK", "PMI_SIZE"},
                                                        {"PMI_SIZE", "PMI_RANK"}}) {
    const std::string error = errorOf([&] { detectLaunch({{set, "1"}, {"MASTER_ADDR", "127.0.0.1"}}); });
    EXPECT_EQ(error.rfind(set + " is set but " + missing + " is not: ", 0), 0u) << error;
  }
}

TEST(LaunchEnv, AiaccWorkerVariables) {
  const EnvMap env = {{"AIACC_RANK", "3"},
                      {"AIACC_WORLD_SIZE", "4"},
                      {"AIACC_LOCAL_RANK", "1"},
                      {"AIACC_LOCAL_SIZE", "2"},
                      {"AIACC_MASTER", "10.0.0.1:29501"},
                      // what an outer launcher left: our own variables win
                      {"RANK", "0"},
                      {"WORLD_SIZE", "1"},
                      {"PET_NNODES", "2"}};
  const LaunchEnv e = detectLaunch(env);
  EXPECT_EQ(e.source, LaunchSource::kAiacc);
  LaunchFlags f;
  f.nproc = 2;  // the worker's command line is the launcher's: consistent by construction
  const LaunchPlan p = planLaunch(e, f);
  EXPECT_EQ(p.role, Role::kWorker);
  EXPECT_EQ(p.world.rank, 3);
  EXPECT_EQ(p.world.world, 4);
  EXPECT_EQ(p.world.local_rank, 1);
  EXPECT_EQ(p.world.local_size, 2);
  EXPECT_EQ(p.store.master, "10.0.0.1:29501");
  EXPECT_EQ(p.store.ports, 1);
  EXPECT_FALSE(p.store.agent_hosted);
  // A worker of another node than the launcher that hosts its store at a job id's port, or the
  // next ones: it looks through them (srun's one task per node).
  EnvMap other = env;
  other["AIACC_MASTER_PORTS"] = "8";
  EXPECT_EQ(planLaunch(detectLaunch(other), f).store.ports, 8);
  for (const char* bad : {"0", "9", "x"}) {
    other["AIACC_MASTER_PORTS"] = bad;
    EXPECT_NE(errorOf([&] { detectLaunch(other); }).find("AIACC_MASTER_PORTS"), std::string::npos) << bad;
  }
}

// What torch.distributed.run (1.13 and 2.x) puts in each worker's environment.
EnvMap torchrunEnv(int rank, int local_rank) {
  return {{"RANK", std::to_string(rank)},
          {"LOCAL_RANK", std::to_string(local_rank)},
          {"GROUP_RANK", "1"},
          {"ROLE_RANK", std::to_string(rank)},
          {"ROLE_NAME", "default"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"WORLD_SIZE", "4"},
          {"GROUP_WORLD_SIZE", "2"},
          {"ROLE_WORLD_SIZE", "4"},
          {"MASTER_ADDR", "node0"},
          {"MASTER_PORT", "29400"},
          {"TORCHELASTIC_RESTART_COUNT", "1"},
          {"TORCHELASTIC_MAX_RESTARTS", "3"},
          {"TORCHELASTIC_RUN_ID", "job7"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"},
          {"OMP_NUM_THREADS", "1"}};
}

TEST(LaunchEnv, TorchrunWorkersConnectToTheAgentsStore) {
  const LaunchEnv e = detectLaunch(torchrunEnv(3, 1));
  EXPECT_EQ(e.source, LaunchSource::kTorchrun);
  EXPECT_EQ(e.nnodes, 2);
  EXPECT_EQ(e.node_rank, 1);
  const LaunchPlan p = planLaunch(e, noFlags());
  EXPECT_EQ(p.role, Role::kWorker);
  EXPECT_EQ(p.world.rank, 3);
  EXPECT_EQ(p.world.world, 4);
  EXPECT_EQ(p.world.local_rank, 1);
  EXPECT_EQ(p.world.local_size, 2);
  EXPECT_EQ(p.store.master, "node0:29400");
  EXPECT_TRUE(p.store.agent_hosted) << "the agent hosts the store: no worker may";
  EXPECT_EQ(p.store.key_prefix, "aiacc/job7/1") << "a restart does not meet the last attempt's keys";
  // c10d rendezvous: MASTER_* name a free port on rank 0's host, no store there yet.
  EnvMap c10d = torchrunEnv(0, 0);
  c10d["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_FALSE(planLaunch(detectLaunch(c10d), noFlags()).store.agent_hosted);
}

TEST(LaunchEnv, TorchrunConflictsNameBothSources) {
  const LaunchEnv e = detectLaunch(torchrunEnv(0, 0));
  LaunchFlags f;
  f.nproc = 3;
  EXPECT_EQ(errorOf([&] { planLaunch(e, f); }),
            "LOCAL_WORLD_SIZE=2 from torchrun conflicts with --nproc 3: drop --nproc under a launcher");
  f = {};
  f.nproc = 2;  // the same count: fine
  EXPECT_EQ(planLaunch(e, f).role, Role::kWorker);
  f = {};
  f.gpus = 8;
  EXPECT_EQ(errorOf([&] { planLaunch(e, f); }),
            "LOCAL_WORLD_SIZE=2 from torchrun conflicts with --gpus 8: under a launcher --gpus must equal its "
            "processes per node (2)");
  f = {};
  f.nnodes = 3;
  EXPECT_EQ(errorOf([&] { planLaunch(e, f); }),
            "GROUP_WORLD_SIZE=2 from torchrun conflicts with --nnodes 3: drop --nnodes under a launcher");
  f = {};
  f.node_rank = 0;
  EXPECT_NE(errorOf([&] { planLaunch(e, f); }).find("GROUP_RANK=1 from torchrun conflicts with --node-rank 0"),
            std::string::npos);
  f = {};
  f.master = "10.1.1.1:29500";
  EXPECT_EQ(errorOf([&] { planLaunch(e, f); }),
            "MASTER_ADDR=node0 MASTER_PORT=29400 from torchrun conflicts with --master 10.1.1.1:29500: drop "
            "--master under a launcher");
  EnvMap broken = torchrunEnv(5, 0);
  EXPECT_NE(errorOf([&] { detectLaunch(broken); }).find("RANK=5 and WORLD_SIZE=4 from torchrun are inconsistent"),
            std::string::npos);
  broken = torchrunEnv(0, 0);
  broken["LOCAL_RANK"] = "two";
  EXPECT_EQ(errorOf([&] { detectLaunch(broken); }), "environment variable LOCAL_RANK='two' is not an integer");
}

// Kubeflow Trainer / PyTorchJob (elastic or nprocPerNode) and JobSet pods without torchrun: this
// process is the node's launcher.
TEST(LaunchEnv, KubeflowPetVariablesStartTheNodesWorkers) {
  const EnvMap env = {{"PET_NNODES", "2"},
                      {"PET_NPROC_PER_NODE", "4"},
                      {"PET_NODE_RANK", "1"},
                      {"PET_MASTER_ADDR", "train-node-0-0.train"},
                      {"PET_MASTER_PORT", "29500"},
                      // PyTorchJob also sets the pod-level variables
                      {"MASTER_ADDR", "train-master-0"},
                      {"MASTER_PORT", "23456"},
                      {"WORLD_SIZE", "8"},
                      {"RANK", "1"}};
  const LaunchEnv e = detectLaunch(env);
  EXPECT_EQ(e.source, LaunchSource::kKubeflow);
  EXPECT_FALSE(e.per_process);
  const LaunchPlan p = planLaunch(e, noFlags());
  EXPECT_EQ(p.role, Role::kSpawn);
  EXPECT_EQ(p.spawn.nproc, 4);
  EXPECT_EQ(p.spawn.nnodes, 2);
  EXPECT_EQ(p.spawn.node_rank, 1);
  EXPECT_EQ(p.spawn.master, "train-node-0-0.train:29500");
  LaunchFlags f;
  f.nproc = 2;
  EXPECT_EQ(errorOf([&] { planLaunch(e, f); }),
            "PET_NPROC_PER_NODE=4 from Kubeflow conflicts with --nproc 2: drop --nproc under a launcher");
  f = {};
  f.nnodes = 1;
  EXPECT_EQ(errorOf([&] { planLaunch(e, f); }),
            "PET_NNODES=2 from Kubeflow conflicts with --nnodes 1: drop --nnodes under a launcher");
  // nprocPerNode "auto" (or cpu, gpu): the count comes from --nproc / --gpus.
  EnvMap autos = env;
  autos["PET_NPROC_PER_NODE"] = "auto";
  f = {};
  f.gpus = 8;
  f.values.nproc = 8;
  const LaunchPlan a = planLaunch(detectLaunch(autos), f);
  EXPECT_EQ(a.spawn.nproc, 8);
  // A JobSet's Indexed Job: the node index from JOB_COMPLETION_INDEX.
  const EnvMap jobset = {{"PET_NNODES", "3"},
                         {"PET_NPROC_PER_NODE", "1"},
                         {"JOB_COMPLETION_INDEX", "2"},
                         {"PET_MASTER_ADDR", "js-workers-0-0.js"},
                         {"PET_MASTER_PORT", "29500"}};
  const LaunchPlan j = planLaunch(detectLaunch(jobset), noFlags());
  EXPECT_EQ(j.role, Role::kSpawn);
  EXPECT_EQ(j.spawn.nproc, 1);
  EXPECT_EQ(j.spawn.node_rank, 2);
  EXPECT_EQ(j.spawn.nnodes, 3);
  // An elastic PyTorchJob (PET_NNODES=MIN:MAX): aiacc_train is the node's launcher of an elastic
  // job, and tells its workers MIN (AIACC_ELASTIC_MIN_NODES); "N:N" is a fixed count.
  const LaunchPlan elastic =
      planLaunch(detectLaunch({{"PET_NNODES", "1:4"}, {"PET_NPROC_PER_NODE", "1"}, {"PET_NODE_RANK", "3"}}), noFlags());
  EXPECT_EQ(elastic.role, Role::kSpawn);
  EXPECT_EQ(elastic.spawn.nnodes, 4);
  EXPECT_EQ(elastic.spawn.min_nodes, 1);
  EXPECT_EQ(planLaunch(detectLaunch({{"PET_NNODES", "2:2"}, {"PET_NPROC_PER_NODE", "1"}, {"PET_NODE_RANK", "1"}}),
                       noFlags())
                .spawn.min_nodes,
            0);
  EXPECT_EQ(errorOf([&] {
              detectLaunch({{"PET_NNODES", "4:1"}, {"PET_NPROC_PER_NODE", "1"}});
            }),
            "PET_NNODES=4:1 is not MIN:MAX with 1 <= MIN <= MAX");
  const LaunchPlan worker = planLaunch(detectLaunch({{"AIACC_RANK", "1"},
                                                     {"AIACC_WORLD_SIZE", "4"},
                                                     {"AIACC_LOCAL_RANK", "0"},
                                                     {"AIACC_LOCAL_SIZE", "1"},
                                                     {"AIACC_ELASTIC_MIN_NODES", "2"}}),
                                       noFlags());
  EXPECT_EQ(worker.role, Role::kWorker);
  EXPECT_EQ(worker.min_nodes, 2);
}

// A PyTorchJob with one process per pod, or a JobSet that sets the variables itself.
TEST(LaunchEnv, RankAndWorldSizeWithoutTorchrun) {
  const EnvMap env = {{"MASTER_ADDR", "job-master-0"}, {"MASTER_PORT", "23456"}, {"WORLD_SIZE", "3"},   {"RANK", "2"},
                      {"PET_NPROC_PER_NODE", "1"},     {"PET_NNODES", "3"},      {"PET_NODE_RANK", "2"}};
  const LaunchEnv e = detectLaunch(env);
  EXPECT_EQ(e.source, LaunchSource::kEnv);
  const LaunchPlan p = planLaunch(e, noFlags());
  EXPECT_EQ(p.role, Role::kWorker);
  EXPECT_EQ(p.world.rank, 2);
  EXPECT_EQ(p.world.world, 3);
  EXPECT_EQ(p.world.local_rank, 0);
  EXPECT_EQ(p.world.local_size, 1);
  EXPECT_EQ(p.store.master, "job-master-0:23456");
  EXPECT_FALSE(p.store.agent_hosted) << "rank 0 hosts it";
}

TEST(LaunchEnv, OpenMpi) {
  const EnvMap env = {{"OMPI_COMM_WORLD_RANK", "5"},       {"OMPI_COMM_WORLD_SIZE", "8"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                      {"OMPI_COMM_WORLD_NODE_RANK", "1"},  {"OMPI_UNIVERSE_SIZE", "8"}};
  const LaunchEnv e = detectLaunch(env);
  EXPECT_EQ(e.source, LaunchSource::kOpenMpi);
  EXPECT_EQ(e.nnodes, 2);
  EXPECT_EQ(e.node_rank, 1);
  // Two nodes, no master given: loopback cannot work, said at once.
  EXPECT_EQ(errorOf([&] { planLaunch(e, noFlags()); }),
            "OMPI_COMM_WORLD_SIZE=8 from Open MPI spans several nodes (OMPI_COMM_WORLD_LOCAL_SIZE=4): give --master "
            "HOST:PORT of rank 0's node (or export MASTER_ADDR and MASTER_PORT to every rank)");
  LaunchFlags f;
  f.master = "10.0.0.1:29500";
  f.values.master = "10.0.0.1:29500";
  const LaunchPlan p = planLaunch(e, f);
  EXPECT_EQ(p.world.rank, 5);
  EXPECT_EQ(p.world.local_rank, 1);
  EXPECT_EQ(p.world.local_size, 4);
  EXPECT_EQ(p.store.master, "10.0.0.1:29500");
  EnvMap exported = env;  // mpirun -x MASTER_ADDR -x MASTER_PORT
  exported["MASTER_ADDR"] = "10.0.0.9";
  exported["MASTER_PORT"] = "29333";
  EXPECT_EQ(planLaunch(detectLaunch(exported), noFlags()).store.master, "10.0.0.9:29333");
  // One node: the default master (loopback) is right.
  const EnvMap one = {{"OMPI_COMM_WORLD_RANK", "1"},
                      {"OMPI_COMM_WORLD_SIZE", "2"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  EXPECT_EQ(planLaunch(detectLaunch(one), noFlags()).store.master, "127.0.0.1:29500");
}

TEST(LaunchEnv, MpichPmi) {
  const EnvMap env = {{"PMI_RANK", "2"},        {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "0"},
                      {"MPI_LOCALNRANKS", "2"}, {"PMI_FD", "5"},   {"MASTER_ADDR", "n1"}};
  const LaunchEnv e = detectLaunch(env);
  EXPECT_EQ(e.source, LaunchSource::kMpich);
  const LaunchPlan p = planLaunch(e, noFlags());
  EXPECT_EQ(p.world.rank, 2);
  EXPECT_EQ(p.world.world, 4);
  EXPECT_EQ(p.world.local_rank, 0);
  EXPECT_EQ(p.world.local_size, 2);
  EXPECT_EQ(p.store.master, "n1:29500");
  LaunchFlags f;
  f.nproc = 4;
  EXPECT_EQ(errorOf([&] { planLaunch(e, f); }),
            "MPI_LOCALNRANKS=2 from MPICH/PMI conflicts with --nproc 4: drop --nproc under a launcher");
}

// What horovodrun --gloo (horovod/runner/gloo_run.py) sets for each slot.
TEST(LaunchEnv, HorovodGloo) {
  const EnvMap env = {{"HOROVOD_GLOO_RENDEZVOUS_ADDR", "10.0.0.1"},
                      {"HOROVOD_GLOO_RENDEZVOUS_PORT", "41234"},
                      {"HOROVOD_CONTROLLER", "gloo"},
                      {"HOROVOD_CPU_OPERATIONS", "gloo"},
                      {"HOROVOD_GLOO_IFACE", "eth0"},
                      {"HOROVOD_HOSTNAME", "host2"},
                      {"HOROVOD_RANK", "3"},
                      {"HOROVOD_SIZE", "4"},
                      {"HOROVOD_LOCAL_RANK", "1"},
                      {"HOROVOD_LOCAL_SIZE", "2"},
                      {"HOROVOD_CROSS_RANK", "1"},
                      {"HOROVOD_CROSS_SIZE", "2"}};
  const LaunchEnv e = detectLaunch(env);
  EXPECT_EQ(e.source, LaunchSource::kHorovod);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.nnodes, 2);
  const LaunchPlan p = planLaunch(e, noFlags());
  EXPECT_EQ(p.world.rank, 3);
  EXPECT_EQ(p.world.world, 4);
  EXPECT_EQ(p.world.local_rank, 1);
  EXPECT_EQ(p.world.local_size, 2);
  EXPECT_EQ(p.store.master, "10.0.0.1:29500") << "the driver's host, where horovodrun runs";
  LaunchFlags f;
  f.master = "host1:29600";  // a default, not the launcher's word: --master overrides it
  EXPECT_EQ(planLaunch(e, f).store.master, "host1:29600");
  f = {};
  f.nnodes = 4;
  EXPECT_EQ(errorOf([&] { planLaunch(e, f); }),
            "HOROVOD_CROSS_SIZE=2 from horovodrun conflicts with --nnodes 4: drop --nnodes under a launcher");
}

TEST(LaunchEnv, MpiRanksOfOneNodeMeetAtAPortOfTheirJob) {
  const EnvMap one = {{"OMPI_COMM_WORLD_RANK", "1"},
                      {"OMPI_COMM_WORLD_SIZE", "2"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                      {"OMPI_MCA_ess_base_jobid", "2745499649"}};
  EXPECT_EQ(planLaunch(detectLaunch(one), noFlags()).store.master, "127.0.0.1:30149");
  EXPECT_EQ(planLaunch(detectLaunch(one), noFlags()).store.ports, comm::kJobPortTries) << "30149 to 30156";
  EnvMap other = one;
  other["OMPI_MCA_ess_base_jobid"] = "2745565185";
  EXPECT_EQ(planLaunch(detectLaunch(other), noFlags()).store.master, "127.0.0.1:29685");
  LaunchFlags f;
  f.master = "127.0.0.1:31000";
  f.values.master = *f.master;
  EXPECT_EQ(planLaunch(detectLaunch(one), f).store.master, "127.0.0.1:31000");
  EXPECT_EQ(planLaunch(detectLaunch(one), f).store.ports, 1) << "--master names one port";
  const EnvMap pmi = {{"PMI_RANK", "0"},
                      {"PMI_SIZE", "2"},
                      {"MPI_LOCALRANKID", "0"},
                      {"MPI_LOCALNRANKS", "2"},
                      {"PMI_JOBID", "kvs_1234_0"}};
  const std::string master = planLaunch(detectLaunch(pmi), noFlags()).store.master;
  EXPECT_EQ(master.rfind("127.0.0.1:", 0), 0u) << master;
  EXPECT_NE(master, "127.0.0.1:29500");
  EnvMap two = one;  // two nodes of two ranks
  two["OMPI_COMM_WORLD_SIZE"] = "4";
  EXPECT_NE(errorOf([&] { planLaunch(detectLaunch(two), noFlags()); }).find("spans several nodes"), std::string::npos);
}

// sbatch -n2 whose script runs aiacc_train with neither srun nor --nproc: one process of a
// two-task allocation would train alone (world 1). It is an error that says what to type;
// --nproc (1 included: on purpose) or --gpus launch as asked.
TEST(LaunchEnv, GpuOfALocalRank) {
  EXPECT_EQ(gpuForLocalRank(3, 8), 3);
  EXPECT_EQ(gpuForLocalRank(3, 1), 0) << "one GPU per task (CUDA_VISIBLE_DEVICES)";
  EXPECT_EQ(gpuForLocalRank(5, 4), 1);
  EXPECT_NE(errorOf([] { gpuForLocalRank(0, 0); }).find("no GPU is visible"), std::string::npos);
}

}  // namespace
}  // namespace aiacc::app