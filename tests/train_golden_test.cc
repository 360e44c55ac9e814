// Step-level equivalence with PyTorch: aiacc's Trainer, given torchvision's initial weights and
// the same fixed batches as scripts/golden_train.py, must take the same optimizer steps as
// torch.optim.SGD does in Python (Nesterov momentum, weight decay on weights only, label
// smoothing, warmup + cosine set before every step) and reach the same parameters, BN running
// statistics and evaluation results. One process, and 2 ranks with DataParallel (PyTorch DDP's
// semantics: BN over each rank's half, averaged gradients, running statistics averaged when read).
// This pins everything in training but the data pipeline (tests/transforms_stats_test.cc).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>

#include "aiacc/config.h"
#include "app/trainer.h"
#include "aiacc/comm/data_parallel.h"
#include "aiacc/comm/gloo_transport.h"
#include "aiacc/comm/store.h"
#include "data/tensor_source.h"
#include "models/weights.h"
#include "tests/comm_test_util.h"
#include "tests/json_util.h"
#include "tests/test_util.h"

namespace aiacc::app {
namespace {

using models::NamedTensors;

std::map<std::string, at::Tensor> byName(const NamedTensors& t) { return {t.begin(), t.end()}; }

// Runs scripts/golden_train.py for `world` ranks into dir; false (with the reason) when
// python3-torchvision is absent.
bool makeGolden(const test::TempDir& dir, int world, std::string* why) {
  const std::string cmd = std::string(AIACC_GOLDEN_PYTHON) + " " + test::sourceDir() + "/scripts/golden_train.py " +
                          dir.path() + " " + std::to_string(world) + " 2> " + (dir / "err.txt");
  const int rc = std::system(cmd.c_str());
  if (WEXITSTATUS(rc) == 3) {
    *why = test::readText(dir / "err.txt");
    return false;
  }
  EXPECT_EQ(rc, 0) << "golden_train.py failed: " << test::readText(dir / "err.txt");
  return rc == 0;
}

// The recipe golden_train.py trains with.
Config goldenConfig(const test::TempDir& dir, int rank, int world) {
  Config c;
  c.arch = "resnet18";
  c.epochs = 3;
  c.stages = {Stage{0, 32, 16 / world, 0.08}};
  c.lr = 0.4;
  c.warmup_epochs = 0.5;
  c.lr_schedule = LrSchedule::kCosine;
  c.momentum = 0.9;
  c.nesterov = true;
  c.weight_decay = 5e-5;
  c.label_smoothing = 0.1;
  c.threads = 1;
  c.progress_seconds = 1e9;
  c.init_weights = dir / "init.bin";
  if (rank == 0) {
    c.metrics_file = dir / "metrics.jsonl";
    c.save_weights = dir / "final.bin";
  }
  return c;
}

void setGoldenData(Trainer& t, const NamedTensors& data, int rank, int world) {
  auto d = byName(data);
  t.setData(std::make_unique<data::TensorBatches>(d["train_images"], d["train_labels"], rank, world, true, 10),
            std::make_unique<data::TensorBatches>(d["val_images"], d["val_labels"], rank, world, false, 10));
}

// Per-step losses, evaluations and the final state against the golden run.
void expectMatchesGolden(const test::TempDir& dir) {
  auto golden = byName(models::readNamedTensors(dir / "golden.bin"));
  const std::string metrics = dir / "metrics.jsonl";
  const std::vector<double> loss = test::metricValues(metrics, "step", "loss");
  const at::Tensor want_loss = golden["loss"].to(at::kDouble);
  ASSERT_EQ(static_cast<int64_t>(loss.size()), want_loss.numel()) << "steps taken";
  ASSERT_GE(loss.size(), 20u);
  for (size_t i = 0; i < loss.size(); ++i) {
    const double want = want_loss[static_cast<int64_t>(i)].item<double>();
    EXPECT_NEAR(loss[i], want, 2e-4 * std::max(1.0, std::abs(want))) << "loss of step " << i + 1;
  }
  // The data is learnable: the run did learn (the comparison is not between two idle runs).
  EXPECT_LT(loss.back(), 0.7 * loss.front());
  const std::vector<double> eval_loss = test::metricValues(metrics, "eval", "loss");
  const std::vector<double> eval_top1 = test::metricValues(metrics, "eval", "top1");
  ASSERT_EQ(static_cast<int64_t>(eval_loss.size()), golden["eval_loss"].numel());
  for (size_t e = 0; e < eval_loss.size(); ++e) {
    const auto i = static_cast<int64_t>(e);
    const double want = golden["eval_loss"][i].item<double>();
    EXPECT_NEAR(eval_loss[e], want, 1e-4 * std::max(1.0, want)) << "eval loss after epoch " << e + 1;
    EXPECT_NEAR(eval_top1[e], golden["eval_top1"][i].item<double>(), 1e-4) << "top-1 after epoch " << e + 1;
  }
  size_t compared = 0;
  for (const auto& [name, t] : models::readNamedTensors(dir / "final.bin")) {
    const auto it = golden.find("final." + name);
    ASSERT_NE(it, golden.end()) << name;
    const at::Tensor want = it->second;
    ++compared;
    if (want.scalar_type() == at::kLong) {
      EXPECT_TRUE(t.equal(want)) << name;
      continue;
    }
    // fp32 tolerance after 24 steps: relative to the tensor's scale.
    const double scale = std::max(1e-3, want.abs().max().item<double>());
    const double diff = (t - want).abs().max().item<double>();
    EXPECT_LE(diff, 1e-3 * scale) << name << ": max |aiacc - PyTorch| " << diff << " (scale " << scale << ")";
  }
  EXPECT_EQ(compared, golden.size() - 3);  // every parameter and buffer
}

TEST(TrainGolden, OneProcessTakesPyTorchsSteps) {
  test::TempDir dir;
  std::string why;
  if (!makeGolden(dir, 1, &why)) GTEST_SKIP() << "golden test skipped: " << why;
  const NamedTensors data = models::readNamedTensors(dir / "data.bin");
  {
    Trainer t(goldenConfig(dir, 0, 1), {}, localSync(), Trainer::Clock::now());
    setGoldenData(t, data, 0, 1);
    t.run();
  }  // the metrics file is complete once the trainer is gone
  expectMatchesGolden(dir);
}

TEST(TrainGolden, TwoRanksWithDataParallelTakePyTorchDdpsSteps) {
  test::TempDir dir;
  std::string why;
  if (!makeGolden(dir, 2, &why)) GTEST_SKIP() << "golden test skipped: " << why;
  const NamedTensors data = models::readNamedTensors(dir / "data.bin");
  auto store = comm::makeHashStore();
  const auto errors = comm::test::runThreads(2, [&](int rank) {
    comm::WorldInfo w;
    w.rank = rank;
    w.world = 2;
    w.local_rank = rank;
    w.local_size = 2;
    SyncFactory make = [&, w](std::shared_ptr<torch::nn::Module> model,
                              const comm::Settings& job) -> std::unique_ptr<comm::GradientSync> {
      comm::agreeAcrossRanks(*store, w, job, std::chrono::seconds(60));  // as aiacc_train does
#if AIACC_WITH_GLOO
      auto transport = std::make_shared<comm::GlooTransport>(store, comm::test::glooOptions(w.rank, 2, 1));
#else  // the CPU transport a build without Gloo has
      comm::ShmOptions so;
      so.rank = w.rank;
      so.world = 2;
      auto transport = std::make_shared<comm::ShmTransport>(store, so);
#endif
      comm::DataParallelOptions o;
      o.buffers = comm::BufferSync::kAverageWhenRead;  // aiacc_train's default (--bn-sync lazy)
      return std::make_unique<comm::DataParallel>(model, transport, w, o);
    };
    Trainer t(goldenConfig(dir, rank, 2), w, make, Trainer::Clock::now());
    setGoldenData(t, data, rank, 2);
    t.run();
  });
  comm::test::expectNoErrors(errors);
  expectMatchesGolden(dir);
}

}  // namespace
}  // namespace aiacc::app
