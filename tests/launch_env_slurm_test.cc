// Slurm's launcher detection as a pure function of the environment: job steps, batch scripts, srun
// with an MPI plugin, and the plan they make with the launch flags (tests/launch_env_test.cc has
// the other launchers; tests/slurm_test.cc runs a real Slurm).
#include <gtest/gtest.h>

#include "app/launch_env.h"
#include "tests/launch_plan_test_util.h"

namespace aiacc::app {
namespace {

using launch_test::errorOf;
using launch_test::noFlags;
using Role = LaunchPlan::Role;

TEST(LaunchEnv, SlurmTasksPerNodeAndNodeLists) {
  EXPECT_EQ(parseSlurmTasksPerNode("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(parseSlurmTasksPerNode("4"), (std::vector<int>{4}));
  EXPECT_EQ(parseSlurmTasksPerNode("1,3(x2)"), (std::vector<int>{1, 3, 3}));
  for (const char* bad : {"", "2(x", "2(3)", "a", "2,", "0"}) {
    EXPECT_NE(errorOf([&] { parseSlurmTasksPerNode(bad); }).find("is malformed"), std::string::npos) << bad;
  }
  EXPECT_EQ(firstSlurmHost("node[01-03,07],gpu5"), "node01");
  EXPECT_EQ(firstSlurmHost("gpu5,node[01-03]"), "gpu5");
  EXPECT_EQ(firstSlurmHost("rack[2,4]-n[007-009]"), "rack2-n007");
  EXPECT_EQ(firstSlurmHost("cn42"), "cn42");
  EXPECT_NE(errorOf([&] { firstSlurmHost("node[01-03"); }).find("unclosed"), std::string::npos);
}

// An srun step: 7 tasks over 4 nodes laid out 2,2,2,1; this task is the second on node 2.
EnvMap slurmStep() {
  return {{"SLURM_JOB_ID", "4242"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_PROCID", "5"},
          {"SLURM_LOCALID", "1"},
          {"SLURM_NODEID", "2"},
          {"SLURM_STEP_NUM_TASKS", "7"},
          {"SLURM_STEP_NUM_NODES", "4"},
          {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"},
          {"SLURM_STEP_NODELIST", "gpu[07-09],gpu12"},
          {"SLURM_JOB_NODELIST", "gpu[07-09,12-13]"},
          {"SLURM_NTASKS", "10"},
          {"SLURM_TASKS_PER_NODE", "2(x5)"},
          {"SLURM_NTASKS_PER_NODE", "2"},
          {"SLURM_NNODES", "5"}};
}

TEST(LaunchEnv, SlurmJobStep) {
  const LaunchEnv e = detectLaunch(slurmStep());
  EXPECT_EQ(e.source, LaunchSource::kSlurm);
  const LaunchPlan p = planLaunch(e, noFlags());
  EXPECT_EQ(p.role, Role::kWorker);
  EXPECT_EQ(p.world.rank, 5);
  EXPECT_EQ(p.world.world, 7) << "the step's tasks, not the job's";
  EXPECT_EQ(p.world.local_rank, 1);
  EXPECT_EQ(p.world.local_size, 2) << "the step's layout on this node, not SLURM_NTASKS_PER_NODE";
  EXPECT_EQ(p.store.master, "gpu07:29742") << "the step's first host; a port per job";
  EXPECT_EQ(p.store.ports, comm::kJobPortTries) << "another job on the node may hold 29742: the next free of 8";
  EnvMap last = slurmStep();
  last["SLURM_NODEID"] = "3";
  last["SLURM_LOCALID"] = "0";
  last["SLURM_PROCID"] = "6";
  EXPECT_EQ(planLaunch(detectLaunch(last), noFlags()).world.local_size, 1);
  EnvMap port = slurmStep();
  port["MASTER_PORT"] = "30000";
  EXPECT_EQ(planLaunch(detectLaunch(port), noFlags()).store.master, "gpu07:30000");
  EXPECT_EQ(planLaunch(detectLaunch(port), noFlags()).store.ports, 1) << "a port given is that port";
  LaunchFlags f;
  f.nproc = 4;
  EXPECT_EQ(errorOf([&] { planLaunch(e, f); }),
            "SLURM_STEP_TASKS_PER_NODE=2(x3),1 from the Slurm job step conflicts with --nproc 4: drop --nproc "
            "under a launcher");
  f = {};
  f.master = "gpu09:29500";  // the first-host default gives way to --master
  EXPECT_EQ(planLaunch(e, f).store.master, "gpu09:29500");
  EXPECT_EQ(planLaunch(e, f).store.ports, 1);
}

// Inside sbatch's script (no srun): the batch step is not a launcher, --gpus/--nproc launch.
TEST(LaunchEnv, SlurmBatchScriptIsNotALauncher) {
  EnvMap batch = {{"SLURM_JOB_ID", "4242"},         {"SLURM_PROCID", "0"},         {"SLURM_NTASKS", "4"},
                  {"SLURM_LOCALID", "0"},           {"SLURM_NODEID", "0"},         {"SLURM_TASKS_PER_NODE", "4"},
                  {"SLURM_JOB_NODELIST", "node01"}, {"SLURM_NTASKS_PER_NODE", "4"}};
  EXPECT_EQ(detectLaunch(batch).source, LaunchSource::kNone);
  for (const char* id : {"4294967291", "4294967292", "4294967294", "4294967295", "batch", "extern"}) {
    batch["SLURM_STEP_ID"] = id;
    EXPECT_EQ(detectLaunch(batch).source, LaunchSource::kNone) << id;
  }
  LaunchFlags f;
  f.gpus = 8;
  f.values.nproc = 8;
  const LaunchPlan p = planLaunch(detectLaunch(batch), f);
  EXPECT_EQ(p.role, Role::kSpawn);
  EXPECT_EQ(p.spawn.nproc, 8);
}

// srun --ntasks-per-node=1 aiacc_train --gpus 8: each task starts its node's 8 workers.
TEST(LaunchEnv, SlurmOneTaskPerNodeStartsTheNodesWorkers) {
  const EnvMap env = {{"SLURM_JOB_ID", "7"},
                      {"SLURM_STEP_ID", "1"},
                      {"SLURM_PROCID", "1"},
                      {"SLURM_LOCALID", "0"},
                      {"SLURM_NODEID", "1"},
                      {"SLURM_STEP_NUM_TASKS", "2"},
                      {"SLURM_STEP_NUM_NODES", "2"},
                      {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
                      {"SLURM_STEP_NODELIST", "a[1-2]"}};
  LaunchFlags f;
  f.gpus = 8;
  f.values.nproc = 8;
  const LaunchPlan p = planLaunch(detectLaunch(env), f);
  EXPECT_EQ(p.role, Role::kSpawn);
  EXPECT_EQ(p.spawn.nproc, 8);
  EXPECT_EQ(p.spawn.nnodes, 2);
  EXPECT_EQ(p.spawn.node_rank, 1);
  EXPECT_EQ(p.spawn.master, "a1:29507");
  // Node 0's launcher hosts the store there or at one of the next 7 (another job may hold the
  // job id's port), for the job every node's launcher names alike.
  EXPECT_EQ(p.spawn.master_ports, 8);
  EXPECT_EQ(p.spawn.job_id, "slurm-7.1");
  EnvMap given = env;
  given["MASTER_PORT"] = "29999";  // a port given is that port alone
  EXPECT_EQ(planLaunch(detectLaunch(given), f).spawn.master_ports, 1);
}

// srun --mpi=pmi2 (sites with MpiDefault=pmi2): Slurm's pmi2 plugin sets PMI_RANK, PMI_SIZE,
// PMI_FD and PMI_JOBID beside the step's variables, for the same task. It is the Slurm step it
// is, with its per-node layout (the GPU of each local rank) and its first host's store, not an
// MPICH job of one rank per node on loopback.
TEST(LaunchEnv, SrunWithPmi2IsTheSlurmStep) {
  EnvMap env = slurmStep();
  env["PMI_RANK"] = "5";
  env["PMI_SIZE"] = "7";
  env["PMI_FD"] = "4";
  env["PMI_JOBID"] = "4242.0";
  const LaunchEnv e = detectLaunch(env);
  EXPECT_EQ(e.source, LaunchSource::kSlurm);
  const LaunchPlan p = planLaunch(e, noFlags());
  EXPECT_EQ(p.world.rank, 5);
  EXPECT_EQ(p.world.world, 7);
  EXPECT_EQ(p.world.local_rank, 1);
  EXPECT_EQ(p.world.local_size, 2);
  EXPECT_EQ(p.store.master, "gpu07:29742");
  // The same under pmix with Open MPI's names.
  EnvMap ompi = slurmStep();
  ompi["OMPI_COMM_WORLD_RANK"] = "5";
  ompi["OMPI_COMM_WORLD_SIZE"] = "7";
  EXPECT_EQ(detectLaunch(ompi).source, LaunchSource::kSlurm);
  // mpiexec (Hydra) inside an allocation starts its proxies with srun, one task per node: the
  // proxy's step describes other tasks than the rank's, and the MPI's variables win.
  EnvMap hydra = {{"SLURM_JOB_ID", "4242"},
                  {"SLURM_STEP_ID", "0"},
                  {"SLURM_PROCID", "1"},
                  {"SLURM_STEP_NUM_TASKS", "2"},
                  {"SLURM_STEP_NUM_NODES", "2"},
                  {"SLURM_STEP_NODELIST", "n[1-2]"},
                  {"PMI_RANK", "5"},
                  {"PMI_SIZE", "8"},
                  {"MPI_LOCALRANKID", "1"},
                  {"MPI_LOCALNRANKS", "4"},
                  {"MASTER_ADDR", "n1"}};
  const LaunchEnv h = detectLaunch(hydra);
  EXPECT_EQ(h.source, LaunchSource::kMpich);
  EXPECT_EQ(planLaunch(h, noFlags()).world.rank, 5);
  // mpirun inside an allocation of one node: its daemon's step has one task.
  EnvMap mpirun = {{"SLURM_JOB_ID", "4242"},
                   {"SLURM_STEP_ID", "0"},
                   {"SLURM_PROCID", "0"},
                   {"SLURM_STEP_NUM_TASKS", "1"},
                   {"OMPI_COMM_WORLD_RANK", "0"},
                   {"OMPI_COMM_WORLD_SIZE", "2"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  EXPECT_EQ(detectLaunch(mpirun).source, LaunchSource::kOpenMpi);
}

// Two mpirun jobs on one node meet at ports of their own: the job id's, not 29500; on several
// nodes the loopback default is refused as before, and MASTER_ADDR or --master wins over it.
TEST(LaunchEnv, ABatchScriptOfSeveralTasksRunAsOneProcessIsAnError) {
  const EnvMap batch = {{"SLURM_JOB_ID", "4242"},    {"SLURM_STEP_ID", "4294967291"}, {"SLURM_NTASKS", "2"},
                        {"SLURM_NPROCS", "2"},       {"SLURM_PROCID", "0"},           {"SLURM_TASKS_PER_NODE", "2"},
                        {"SLURM_JOB_NODELIST", "n1"}};
  const LaunchEnv e = detectLaunch(batch);
  EXPECT_EQ(e.source, LaunchSource::kNone);
  EXPECT_EQ(errorOf([&] { planLaunch(e, noFlags()); }),
            "SLURM_NTASKS=2: this Slurm job has 2 tasks, but aiacc_train runs here as one process (its batch script, "
            "not a job step): start a rank per task with `srun aiacc_train ...`, or the workers itself with --nproc N "
            "(--nproc 1: one process on purpose)");
  LaunchFlags f;
  f.nproc = 1;
  EXPECT_EQ(planLaunch(e, f).role, Role::kSingle);
  f.nproc = 2;
  f.values.nproc = 2;
  const LaunchPlan p = planLaunch(e, f);
  EXPECT_EQ(p.role, Role::kSpawn);
  EXPECT_TRUE(p.spawn.pick_port) << "one node, no --master: a free port";
  EnvMap one_task = batch;
  one_task["SLURM_NTASKS"] = "1";
  one_task["SLURM_NPROCS"] = "1";
  EXPECT_EQ(planLaunch(detectLaunch(one_task), noFlags()).role, Role::kSingle);
  LaunchFlags given;
  given.nproc = 2;
  given.values.nproc = 2;
  given.master = "127.0.0.1:29600";
  EXPECT_FALSE(planLaunch(e, given).spawn.pick_port) << "--master given: its port";
}

// In a batch script, run by its shell rather than exec'ed: Slurm's signals would never reach
// aiacc_train, which warns at start and names the fix (and says when it runs itself as a job
// step); exec'ed (parent slurmstepd), under srun or outside Slurm, no warning.
TEST(LaunchEnv, ABatchScriptsShellIsWarnedAbout) {
  const EnvMap batch = {{"SLURM_JOB_ID", "4242"}, {"SLURM_NTASKS", "1"}, {"SLURM_PROCID", "0"}};
  const LaunchEnv e = detectLaunch(batch);
  EXPECT_TRUE(e.slurm_batch);
  const std::string said =
      "aiacc_train runs under its Slurm batch script's shell (bash), not as the batch step: Slurm's signals "
      "(scancel, scancel --signal, --signal=B:...) reach the shell, and the job would stop without saving; ";
  const std::string fix = "start it with `exec aiacc_train ...` (or `srun aiacc_train ...`) in the script";
  EXPECT_EQ(batchScriptWarning(e, "bash", false), said + fix);
  EXPECT_EQ(batchScriptWarning(e, "bash", true),
            said +
                "it runs itself as a job step (srun) instead, which a cancel, a requeue or the job's end stops "
                "with SIGTERM, saving (--signal=B: still reaches the shell alone); " +
                fix);
  for (bool as_step : {false, true}) {
    EXPECT_EQ(batchScriptWarning(e, "slurmstepd", as_step), "");
    EXPECT_EQ(batchScriptWarning(detectLaunch(slurmStep()), "bash", as_step), "");
    EXPECT_EQ(batchScriptWarning(detectLaunch({}), "bash", as_step), "");
  }
  EXPECT_FALSE(detectLaunch(slurmStep()).slurm_batch);
}

// The job step it runs itself as: one task on this node with the job's CPUs and GPUs there, shared
// with any other step, appending to the batch script's output files itself (through a shell that
// redirects, then execs), then the same program and arguments; the batch's per-task and per-GPU
// variables unset. Where Slurm's variables are missing or odd, srun's defaults; where the output
// is no file, srun's forwarding. No step for a process that needs none, for one run by another
// shell than the batch script's (salloc's), or for one whose flags name other nodes or a store.
TEST(LaunchEnv, ABatchScriptsShellsChildRunsItselfAsAJobStep) {
  const EnvMap batch = {{"SLURM_JOB_ID", "4242"},     {"SLURM_NTASKS", "1"},         {"SLURM_PROCID", "0"},
                        {"SLURMD_NODENAME", "node7"}, {"SLURM_CPUS_ON_NODE", "16"},  {"SLURM_GPUS_ON_NODE", "8"},
                        {"SLURM_CPUS_PER_GPU", "2"},  {"SLURM_NTASKS_PER_NODE", "1"}};
  const LaunchEnv e = detectLaunch(batch);
  LaunchFlags nproc2;
  nproc2.nproc = 2;
  nproc2.values.nproc = 2;
  const LaunchPlan plan = planLaunch(e, nproc2);
  const std::vector<std::string> args = {"--data", "/d", "--nproc", "2"};
  const std::string redirect =
      R"(o=$1; e=$2; shift 2; [ -z "$o" ] || exec >> "$o"; [ -z "$e" ] || exec 2>> "$e"; exec "$@")";
  const JobStep step = srunAsJobStep(e, plan, "slurm_script", batch, "/opt/aiacc_train", args, "/out/j 1.log", "");
  EXPECT_EQ(step.argv,
            (std::vector<std::string>{"srun", "--nodes=1", "--ntasks=1", "--overlap", "--nodelist=node7",
                                      "--cpus-per-task=16", "--gres=gpu:8", "/bin/sh", "-c", redirect, "sh",
                                      "/out/j 1.log", "", "/opt/aiacc_train", "--data", "/d", "--nproc", "2"}));
  EXPECT_EQ(step.unset, (std::vector<std::string>{"SLURM_CPUS_PER_GPU", "SLURM_NTASKS_PER_NODE"}));
  EnvMap bare = {
      {"SLURM_JOB_ID", "4242"}, {"SLURM_NTASKS", "1"}, {"SLURM_CPUS_ON_NODE", "16(x2)"}, {"SLURM_GPUS_ON_NODE", "0"}};
  const JobStep plain = srunAsJobStep(detectLaunch(bare), plan, "slurm_script", bare, "/opt/aiacc_train", args, "", "");
  EXPECT_EQ(plain.argv, (std::vector<std::string>{"srun", "--nodes=1", "--ntasks=1", "--overlap", "/opt/aiacc_train",
                                                  "--data", "/d", "--nproc", "2"}));
  EXPECT_TRUE(plain.unset.empty());
  for (const char* odd : {"-2", "1000000", "+4", "4 "}) {  // (no count srun would take as Slurm wrote it)
    bare["SLURM_CPUS_ON_NODE"] = odd;
    EXPECT_EQ(srunAsJobStep(detectLaunch(bare), plan, "slurm_script", bare, "/opt/aiacc_train", args, "", "").argv,
              plain.argv)
        << odd;
  }
  const auto none = [&](const LaunchEnv& env, const LaunchPlan& p, const std::string& parent, const std::string& exe) {
    return srunAsJobStep(env, p, parent, batch, exe, args, "", "").argv.empty();
  };
  EXPECT_FALSE(none(e, plan, "slurm_script", "/opt/aiacc_train"));
  EXPECT_TRUE(none(e, plan, "slurmstepd", "/opt/aiacc_train"));
  EXPECT_TRUE(none(e, plan, "bash", "/opt/aiacc_train"));  // (salloc's shell, say)
  EXPECT_TRUE(none(e, plan, "slurm_script", ""));
  EXPECT_TRUE(none(detectLaunch(slurmStep()), plan, "slurm_script", "/opt/aiacc_train"));
  LaunchFlags two_nodes = nproc2;
  two_nodes.nnodes = 2;
  two_nodes.values.nnodes = 2;
  two_nodes.node_rank = 0;
  two_nodes.master = "n1:29600";
  two_nodes.values.master = "n1:29600";
  EXPECT_TRUE(none(e, planLaunch(e, two_nodes), "slurm_script", "/opt/aiacc_train"));
  LaunchFlags master = nproc2;
  master.master = "127.0.0.1:29600";
  master.values.master = "127.0.0.1:29600";
  EXPECT_TRUE(none(e, planLaunch(e, master), "slurm_script", "/opt/aiacc_train"));
  EXPECT_FALSE(none(e, planLaunch(e, noFlags()), "slurm_script", "/opt/aiacc_train"));  // one process
}

}  // namespace
}  // namespace aiacc::app
