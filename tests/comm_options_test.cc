// DataParallelOptions: the AIACC_* variables parsed into it, and ranks given different options
// stopped at construction with the option named.
#include <gtest/gtest.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <string>
#include <vector>

#include "aiacc/comm/data_parallel.h"
#include "tests/comm_test_util.h"

namespace aiacc::comm {
namespace {

TEST(CommOptions, EnvironmentSetsTheMainKnobs) {
  const EnvMap env = {{"AIACC_BUCKET_MB", "4.5"},
                      {"AIACC_FIRST_BUCKET_MB", "0.25"},
                      {"AIACC_ALLREDUCE_DTYPE", "bf16"},
                      {"AIACC_GRAD_SCALE", "512"},
                      {"AIACC_STREAMS", "3"},
                      {"AIACC_BN_SYNC", "broadcast"},
                      {"AIACC_FIND_UNUSED", "1"},
                      {"AIACC_AUTOTUNE", "on"},
                      {"OTHER", "x"}};
  DataParallelOptions o;
  const std::vector<std::string> applied = applyEnvironment(o, env);
  EXPECT_EQ(applied.size(), envKnobs().size());
  EXPECT_EQ(o.reducer.bucket_mb, 4.5);
  EXPECT_EQ(o.reducer.first_bucket_mb, 0.25);
  EXPECT_EQ(o.codec.dtype, TransferDtype::kBFloat16);
  EXPECT_EQ(o.codec.grad_scale, 512);
  EXPECT_EQ(o.striping.channels, 3);
  EXPECT_EQ(o.buffers, BufferSync::kBroadcast);
  EXPECT_TRUE(o.reducer.detect_unused);
  EXPECT_TRUE(o.autotune);
  // Unset and empty variables leave the defaults, which are the parts' own.
  const DataParallelOptions d = optionsFromEnvironment({{"AIACC_BUCKET_MB", ""}});
  EXPECT_EQ(d.reducer.bucket_mb, ReducerOptions{}.bucket_mb);
  EXPECT_EQ(d.reducer.bucket_mb, kDefaultBucketMb);
  EXPECT_EQ(TuneConfig{}.bucket_mb, kDefaultBucketMb);
  EXPECT_EQ(d.codec.dtype, CodecOptions{}.dtype);
  EXPECT_EQ(d.striping.channels, StripingOptions{}.channels);
  EXPECT_EQ(d.buffers, kDefaultBufferSync);
  EXPECT_FALSE(d.autotune);
}

TEST(CommOptions, AValueThatCannotBeReadIsAnErrorNamingTheVariable) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"AIACC_BUCKET_MB", "0"},         {"AIACC_BUCKET_MB", "25MB"}, {"AIACC_BUCKET_MB", "nan"},
      {"AIACC_ALLREDUCE_DTYPE", "f16"}, {"AIACC_STREAMS", "17"},     {"AIACC_STREAMS", "2.5"},
      {"AIACC_BN_SYNC", "sometimes"},   {"AIACC_FIND_UNUSED", "2"},  {"AIACC_AUTOTUNE", "maybe"},
      {"AIACC_GRAD_SCALE", "-1"},
  };
  for (const auto& [name, value] : bad) {
    DataParallelOptions o;
    try {
      // A good value beside it is not applied either: all or nothing.
      applyEnvironment(o, {{name, value}, {name == "AIACC_AUTOTUNE" ? "AIACC_FIND_UNUSED" : "AIACC_AUTOTUNE", "1"}});
      ADD_FAILURE() << name << "=" << value << " was accepted";
    } catch (const InputError& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind(name + "='" + value + "': must be ", 0), 0u) << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
    const Settings now = optionSettings(o), before = optionSettings(DataParallelOptions{});
    ASSERT_EQ(now.size(), before.size());
    for (size_t i = 0; i < now.size(); ++i) EXPECT_EQ(now[i].value, before[i].value) << now[i].name << " changed";
  }
}

// Rank 1 differs from rank 0 in one option: every rank stops at construction with an InputError
// naming it and both values, before any gradient is exchanged.
void expectRanksRefuse(const std::function<void(int, DataParallelOptions&)>& set, const std::string& want) {
  const int W = 2;
  const std::vector<std::string> errors = test::runRanks(W, [&](int r, std::shared_ptr<Transport> t) {
    DataParallelOptions o;
    set(r, o);
    DataParallel dp(std::make_shared<torch::nn::LinearImpl>(4, 2), t, WorldInfo{r, W, r, W}, o);
  });
  for (int r = 0; r < W; ++r) EXPECT_NE(errors[r].find(want), std::string::npos) << "rank " << r << ": " << errors[r];
}

class OneLineHook : public CommHook {
 public:
  std::shared_ptr<Work> launch(GradBucket& b, Transport& t) override { return t.allreduce(b.buffer); }
  bool finish(GradBucket& b) override {
    b.buffer.div_(b.world);
    return true;
  }
  std::string name() const override { return "plain-sum"; }
};

TEST(CommOptions, RanksWithDifferentOptionsStopAtConstruction) {
  expectRanksRefuse([](int r, DataParallelOptions& o) { o.reducer.bucket_mb = r == 1 ? 8 : 25; },
                    "different options: reducer.bucket_mb is 8 on rank 1 but 25 on rank 0");
  expectRanksRefuse(
      [](int r, DataParallelOptions& o) {
    if (r == 1) applyEnvironment(o, {{"AIACC_ALLREDUCE_DTYPE", "fp16"}});
      },
      "codec.dtype is fp16 on rank 1 but fp32 on rank 0");
  expectRanksRefuse(
      [](int r, DataParallelOptions& o) {
    if (r == 1) o.reducer.hook = std::make_shared<OneLineHook>();
      },
      "reducer.hook is plain-sum on rank 1 but none on rank 0");
}

// broadcast_parameters off (an elastic regroup, which restores the model itself where it
// differs): each rank keeps its own parameters at construction, the buffers still come from rank 0.
TEST(CommOptions, ParametersStayWhenTheirBroadcastIsOff) {
  for (bool broadcast : {true, false}) {
    std::vector<float> weight(3), mean(3);
    test::expectNoErrors(test::runRanks(3, [&](int r, std::shared_ptr<Transport> t) {
      auto seq = torch::nn::Sequential(torch::nn::Linear(4, 4), torch::nn::BatchNorm1d(4));
      {
        at::NoGradGuard no_grad;
        for (auto& p : seq->parameters()) p.fill_(static_cast<float>(r));
        for (auto& b : seq->buffers()) {
          if (b.is_floating_point()) b.fill_(static_cast<float>(r));
        }
      }
      DataParallelOptions o;
      o.broadcast_parameters = broadcast;
      DataParallel dp(seq.ptr(), t, WorldInfo{r, 3, r, 3}, o);
      weight[r] = seq->named_parameters()["0.weight"][0][0].item<float>();
      mean[r] = seq->named_buffers()["1.running_mean"][0].item<float>();
    }));
    for (int r = 0; r < 3; ++r) {
      EXPECT_FLOAT_EQ(weight[r], broadcast ? 0.0f : static_cast<float>(r)) << "broadcast " << broadcast;
      EXPECT_FLOAT_EQ(mean[r], 0.0f) << "broadcast " << broadcast;
    }
  }
}

TEST(CommOptions, ParametersOnTwoDevicesAreRefused) {
  auto m = std::make_shared<torch::nn::LinearImpl>(4, 2);
  m->register_parameter("elsewhere", at::zeros({3}, at::TensorOptions().device(at::kMeta)));
  try {
    DataParallel dp(m, std::make_shared<test::ImmediateTransport>(1), WorldInfo{});
    ADD_FAILURE() << "parameters on cpu and meta were accepted";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("meta"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace aiacc::comm
