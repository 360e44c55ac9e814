// --dry-run (app/dry_run.h): the description of a run as a pure function, and the binary checking
// a command line without running it: exit 0 and nothing made, or the run's usage error (exit 2).
#include "app/dry_run.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "tests/test_util.h"

namespace aiacc::app {
namespace {

Config smallConfig() {
  Config c;
  c.data = "/imagenet";
  c.epochs = 16;
  c.stages = {Stage{0, 128, 256, 0.35}, Stage{14, 224, 192, 0.35}};
  c.target_top5 = 93;
  return c;
}

TEST(DryRun, DescribesEachRoleAndWhatTrains) {
  DistSpec dist;
  LaunchPlan single;
  const std::string one = describeRun(single, dist, smallConfig());
  EXPECT_NE(one.find("runs:        one CPU process (no launcher)\n"), std::string::npos) << one;
  EXPECT_NE(one.find("trains:      resnet50 on /imagenet, 16 epoch(s)\n"), std::string::npos) << one;
  EXPECT_NE(one.find("stage:       from epoch 0, 128 px, batch 256 per process\n"
                     "  stage:       from epoch 14, 224 px, batch 192 per process\n"),
            std::string::npos)
      << one;
  EXPECT_NE(one.find("target:      top-5 93%\n"), std::string::npos) << one;
  EXPECT_NE(one.find("checkpoints: none (--checkpoint-dir)\n"), std::string::npos) << one;

  LaunchPlan spawn;
  spawn.role = LaunchPlan::Role::kSpawn;
  spawn.spawn.nproc = 8;
  spawn.spawn.nnodes = 4;
  spawn.spawn.min_nodes = 2;
  spawn.spawn.node_rank = 1;
  spawn.spawn.master = "10.0.0.1:29500";
  dist.gpus = 8;
  Config c = smallConfig();
  c.checkpoint_dir = "ck";
  c.resume = "auto";
  const std::string launcher = describeRun(spawn, dist, c);
  EXPECT_NE(launcher.find("runs:        a launcher: 8 GPU worker(s) on node 1 of 2:4 (elastic); store at "
                          "10.0.0.1:29500\n"),
            std::string::npos)
      << launcher;
  EXPECT_NE(launcher.find("checkpoints: ck, resume auto\n"), std::string::npos) << launcher;

  LaunchPlan worker;
  worker.role = LaunchPlan::Role::kWorker;
  worker.source = LaunchSource::kTorchrun;
  worker.world = comm::WorldInfo{3, 8, 1, 4};
  worker.store.master = "node0:29400";
  worker.store.agent_hosted = true;
  const std::string rank = describeRun(worker, dist, smallConfig());
  EXPECT_NE(rank.find("runs:        rank 3 of 8 (local 1 of 4) GPU, started by torchrun; store at node0:29400 "
                      "(the launcher's)\n"),
            std::string::npos)
      << rank;
  worker.source = LaunchSource::kOpenMpi;  // one node, the store at its job id's port or the next free
  worker.store = {};
  worker.store.master = "127.0.0.1:30149";
  worker.store.ports = comm::kJobPortTries;
  const std::string mpi = describeRun(worker, dist, smallConfig());
  EXPECT_NE(mpi.find("started by Open MPI; store at 127.0.0.1:30149 or one of the next 7 ports\n"), std::string::npos)
      << mpi;
}

// The binary: a valid command line is described and nothing starts; an invalid one is the usage
// error the run would meet, launcher variables included.
TEST(DryRun, ChecksTheCommandLineWithoutRunningIt) {
  test::TempDir d;
  auto [rc, out] = test::runTrain("--dry-run --nproc 2 --data " + d.path() + "/missing --recipe " + test::sourceDir() +
                                  "/recipes/cpu_sample.recipe");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("aiacc_train --dry-run: the command line is valid\n"), std::string::npos) << out;
  EXPECT_NE(out.find("a launcher: 2 CPU worker(s) on node 0 of 1; store on this node, at a free port"),
            std::string::npos)
      << out;
  std::tie(rc, out) = test::runTrain("--dry-run --make-sample " + d.path() + "/sample");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_FALSE(std::filesystem::exists(d / "sample")) << "a dry run makes nothing";
  for (const std::string& bad :
       {std::string("--dry-run --data synthetic --arch resnet7"), std::string("--dry-run --epochs 3"),
        std::string("--dry-run --data synthetic --max-restarts 1"),
        std::string("--dry-run --data synthetic --recipe ") + d.path() + "/none.recipe"}) {
    std::tie(rc, out) = test::runTrain(bad);
    EXPECT_EQ(rc, 2) << bad << "\n" << out;
    EXPECT_EQ(out.rfind("aiacc_train: error: ", 0), 0u) << bad << "\n" << out;
  }
  std::tie(rc, out) = test::runShell("env RANK=1 " + std::string(AIACC_TRAIN_BIN) + " --dry-run --data synthetic 2>&1");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("RANK is set but WORLD_SIZE is not"), std::string::npos) << out;
}

}  // namespace
}  // namespace aiacc::app
