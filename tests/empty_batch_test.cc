// A rank whose batch decoded to nothing (every file skipped) still takes part in the step: it
// contributes zeros, and every decoded image keeps its weight 1 / (world x batch). The closed
// form of the zeros' average: DataParallel.RankWithoutBackwardContributesZeros.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "app/trainer.h"
#include "aiacc/comm/agreement.h"
#include "aiacc/comm/data_parallel.h"
#include "aiacc/comm/shm_transport.h"
#include "aiacc/comm/store.h"
#include "data/tensor_source.h"
#include "tests/comm_test_util.h"

namespace aiacc {
namespace {

// Serves the inner source's batches, but batch `at` of each epoch comes back empty (as when
// every file in it failed to decode).
class EmptyAt : public data::BatchSource {
 public:
  EmptyAt(std::unique_ptr<data::BatchSource> inner, int64_t at) : inner_(std::move(inner)), at_(at) {}
  int64_t startEpoch(const data::EpochSpec& spec) override {
    i_ = 0;
    return inner_->startEpoch(spec);
  }
  std::optional<data::Batch> next() override {
    std::optional<data::Batch> b = inner_->next();
    if (b && i_++ == at_) {
      b->images = b->images.narrow(0, 0, 0);
      b->labels = b->labels.narrow(0, 0, 0);
    }
    return b;
  }
  int64_t numClasses() const override { return inner_->numClasses(); }
  int64_t shardSize() const override { return inner_->shardSize(); }

 private:
  std::unique_ptr<data::BatchSource> inner_;
  int64_t at_, i_ = 0;
};

// aiacc_train's loop on 2 rank-threads whose rank 1 gets an empty second batch: every step
// completes on both ranks (before, rank 1 skipped the step and rank 0 waited out the timeout).
TEST(EmptyBatch, TrainerRankWithAnEmptyBatchTakesPart) {
  const at::Tensor images = at::randn({32, 3, 16, 16}, at::detail::createCPUGenerator(7), at::kFloat);
  const at::Tensor labels = at::randint(0, 4, {32}, at::detail::createCPUGenerator(8), at::kLong);
  app::Config c;
  c.arch = "resnet18";
  c.epochs = 1;
  c.stages = {app::Stage{0, 16, 4, 0.08}};
  c.warmup_epochs = 0;
  c.threads = 1;
  c.progress_seconds = 1e9;
  auto store = comm::makeHashStore();
  std::vector<app::Report> reports(2);
  const auto errors = comm::test::runThreads(2, [&](int r) {
    comm::WorldInfo w;
    w.rank = r;
    w.world = 2;
    w.local_rank = r;
    w.local_size = 2;
    app::SyncFactory make = [&, w](std::shared_ptr<torch::nn::Module> model,
                                   const comm::Settings& job) -> std::unique_ptr<comm::GradientSync> {
      comm::agreeAcrossRanks(*store, w, job, std::chrono::seconds(30));
      comm::ShmOptions so;
      so.rank = w.rank;
      so.world = 2;
      so.timeout = std::chrono::seconds(20);
      comm::DataParallelOptions o;
      o.buffers = comm::BufferSync::kAverageWhenRead;
      return std::make_unique<comm::DataParallel>(model, std::make_shared<comm::ShmTransport>(store, so), w, o);
    };
    app::Trainer t(c, w, make, app::Trainer::Clock::now());
    std::unique_ptr<data::BatchSource> train = std::make_unique<data::TensorBatches>(images, labels, r, 2,
                                                                                     /*train=*/true, 4);
    if (r == 1) train = std::make_unique<EmptyAt>(std::move(train), 1);
    t.setData(std::move(train), std::make_unique<data::TensorBatches>(images, labels, r, 2, false, 4));
    reports[r] = t.run();
  });
  comm::test::expectNoErrors(errors);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(reports[r].steps, 4) << "rank " << r;  // 32 images / 2 ranks / 4
  EXPECT_EQ(reports[0].final_top1, reports[1].final_top1);
}

}  // namespace
}  // namespace aiacc
