// GPU tests, for a machine with a GPU and a CUDA LibTorch (scripts/gpu/check.sh runs them).
// Compiled into aiacc_tests in a CUDA build with NCCL; elsewhere CTest syntax-checks this file
// (GpuSources.SyntaxCheck) so it cannot rot unseen. One GPU allows world size 1 only; what is
// checked is the GPU half of each mechanism: NCCL round trips and stream ordering, the cast and
// unscale kernels, DataParallel's event ordering against the local gradients, the device-side
// input normalization, and the trainer with AMP and channels-last.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <string>

#include "app/amp.h"
#include "app/trainer.h"
#include "comm/data_parallel.h"
#include "comm/nccl_transport.h"
#include "comm/transport.h"
#include "comm/store.h"
#include "data/device_input.h"
#include "tests/test_util.h"
#include "tests/train_problem.h"

namespace aiacc {
namespace {

#define AIACC_REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible"

at::TensorOptions cuda(at::ScalarType t = at::kFloat) { return at::TensorOptions().dtype(t).device(at::kCUDA, 0); }

std::shared_ptr<comm::NcclTransport> ncclWorldOne(int channels) {
  comm::NcclOptions o;
  o.channels = channels;
  return std::make_shared<comm::NcclTransport>(comm::makeHashStore(), o);
}

// Every collective, on device and host tensors, in each dtype DataParallel sends. World 1: the
// results are the inputs, and an out-of-place result proves the data went through.
TEST(Gpu, NcclTransportRoundTrip) {
  AIACC_REQUIRE_GPU();
  auto t = ncclWorldOne(2);
  EXPECT_EQ(t->channels(), 2);
  for (at::ScalarType dt : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (int ch = 0; ch < 2; ++ch) {
      const at::Tensor ref = at::arange(1001, cuda(at::kFloat)).to(dt);
      at::Tensor x = ref.clone();
      t->allreduce(x, comm::ReduceOp::kSum, ch)->wait();
      EXPECT_TRUE(x.equal(ref));
      t->broadcast(x, 0, ch)->wait();
      EXPECT_TRUE(x.equal(ref));
      at::Tensor out = at::zeros_like(ref);
      t->allgather(x, out, ch)->wait();
      EXPECT_TRUE(out.equal(ref));
      t->reduceScatter(x, ch)->wait();
      t->allgatherShards(x, ch)->wait();
      EXPECT_TRUE(x.equal(ref));
    }
  }
  at::Tensor host = at::arange(10, at::kLong);  // control traffic: staged through the device
  t->allreduce(host, comm::ReduceOp::kBitwiseOr, 0)->wait();
  EXPECT_TRUE(host.equal(at::arange(10, at::kLong)));
  EXPECT_GT(t->channelStats(0).bytes, 0);
}

// Ordering without host synchronization: work queued on the caller's stream (a side stream,
// busy for a while) is seen by the collective, and the caller's stream sees its result.
TEST(Gpu, NcclOperationsOrderAfterTheCallersStream) {
  AIACC_REQUIRE_GPU();
  auto t = ncclWorldOne(1);
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  c10::cuda::CUDAStreamGuard guard(side);
  at::Tensor x = at::zeros({1 << 24}, cuda());
  for (int k = 0; k < 50; ++k) x.add_(1);  // ~50 kernels queued ahead of the collective
  at::Tensor out = at::empty_like(x);
  t->allgather(x, out, 0)->wait();
  EXPECT_EQ(out.min().item<float>(), 50.0f);
  EXPECT_EQ(out.max().item<float>(), 50.0f);
}

// The fused CUDA unscale-and-check gives the CPU loop's answer: same gradients, same verdict.
TEST(Gpu, GradScalerUnscalesOnTheDeviceLikeTheCpu) {
  AIACC_REQUIRE_GPU();
  torch::manual_seed(1);
  std::vector<at::Tensor> cpu, gpu;
  for (int64_t n : {7, 1000, 33}) {
    at::Tensor p = at::zeros({n}).requires_grad_(true);
    p.mutable_grad() = at::randn({n}) * 4096;
    cpu.push_back(p);
    at::Tensor q = at::zeros({n}, cuda()).requires_grad_(true);
    q.mutable_grad() = p.grad().to(at::kCUDA);
    gpu.push_back(q);
  }
  app::GradScalerOptions o;
  o.init_scale = 4096;
  app::GradScaler a(o), b(o);
  EXPECT_TRUE(a.unscaleAndCheck(cpu));
  EXPECT_TRUE(b.unscaleAndCheck(gpu));
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_TRUE(gpu[i].grad().cpu().equal(cpu[i].grad()));
  gpu[1].mutable_grad()[5] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(b.unscaleAndCheck(gpu));
}

// The GPU input path: uint8 batches normalized on the GPU equal the CPU computation.
TEST(Gpu, BytesNormalizedOnTheDeviceMatchTheCpu) {
  AIACC_REQUIRE_GPU();
  torch::manual_seed(2);
  const at::Tensor nhwc = at::randint(0, 256, {4, 40, 40, 3}, at::kByte);
  const at::Tensor images = nhwc.permute({0, 3, 1, 2});  // the loader's bytes batch
  for (bool cl : {false, true}) {
    const at::Tensor want = data::imagesOnDevice(images, at::kCPU, cl);
    const at::Tensor got = data::imagesOnDevice(images.pin_memory(), at::Device(at::kCUDA, 0), cl);
    EXPECT_TRUE(got.is_cuda());
    EXPECT_TRUE(got.is_contiguous(cl ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous));
    EXPECT_LE((got.cpu() - want).abs().max().item<float>(), 1e-6f);
  }
}

torch::nn::Sequential convNet() {
  namespace nn = torch::nn;
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(3, 16, 3).padding(1).bias(false)), nn::BatchNorm2d(16), nn::ReLU(),
                        nn::Conv2d(nn::Conv2dOptions(16, 32, 3).stride(2).padding(1)), nn::ReLU(),
                        nn::AdaptiveAvgPool2d(1), nn::Flatten(), nn::Linear(32, 10));
}

// DataParallel over NCCL (world 1, several small buckets on two channels, backward on a side
// stream): the gradients written back equal plain backward's, to rounding in fp32 (cuDNN's
// backward may sum in another order between two runs) and within fp16 rounding with fp16
// transfer (cast and unscale on the device). Stale or unordered reads would be far off.
TEST(Gpu, DataParallelOverNcclGivesTheLocalGradients) {
  AIACC_REQUIRE_GPU();
  at::globalContext().setDeterministicCuDNN(true);
  for (comm::TransferDtype transfer : {comm::TransferDtype::kFloat32, comm::TransferDtype::kFloat16}) {
    torch::manual_seed(3);
    auto ref = convNet();
    ref->to(at::kCUDA);
    auto net = convNet();
    net->to(at::kCUDA);
    {
      torch::NoGradGuard no_grad;
      auto a = ref->parameters(), b = net->parameters();
      for (size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
    }
    const at::Tensor x = at::randn({8, 3, 32, 32}, cuda());
    const at::Tensor y = at::randint(0, 10, {8}, cuda(at::kLong));
    torch::nn::functional::cross_entropy(ref->forward(x), y).backward();

    comm::DataParallelOptions o;
    o.bucket_mb = 0.005;  // several buckets
    o.first_bucket_mb = 0.001;
    o.channels = 2;
    o.transfer = transfer;
    o.autotune = false;
    comm::DataParallel dp(net.ptr(), ncclWorldOne(2), comm::WorldInfo{}, o);
    EXPECT_GT(dp.plan().buckets.size(), 2u);
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
    {
      c10::cuda::CUDAStreamGuard guard(side);
      dp.beforeForward();
      torch::nn::functional::cross_entropy(net->forward(x), y).backward();
      ASSERT_TRUE(dp.finishBackward());
    }
    auto a = ref->parameters(), b = net->parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      if (transfer == comm::TransferDtype::kFloat32) {
        EXPECT_TRUE(at::allclose(b[i].grad(), a[i].grad(), 1e-5, 1e-7)) << "parameter " << i;
      } else {
        const float bound = 2e-3f * a[i].grad().abs().max().item<float>() + 1e-6f;
        EXPECT_LE((b[i].grad() - a[i].grad()).abs().max().item<float>(), bound) << "parameter " << i;
      }
    }
  }
}

// The trainer on the GPU: AMP fp16 with the loss scaler, channels-last, pinned uint8 batches
// normalized on the device. It learns the generated sample.
TEST(Gpu, TrainerLearnsWithAmpAndChannelsLast) {
  AIACC_REQUIRE_GPU();
  test::TempDir dir;
  test::makeLearnableSample(dir / "ds");
  app::Config c = test::learnableConfig(dir / "ds");
  c.cuda = true;
  c.amp = true;
  c.amp_dtype = app::AmpDtype::kFp16;
  c.channels_last = true;
  c.workers = 2;
  app::Report r = app::Trainer(c, {}, app::localSync(), app::Trainer::Clock::now()).run();
  EXPECT_EQ(r.device, "cuda:0");
  EXPECT_EQ(r.precision, "amp fp16");
  EXPECT_GT(r.loss_scale, 0);
  EXPECT_GT(r.final_top1, 60.0) << "chance is 12.5%";
  EXPECT_EQ(r.skipped_files, 0);
}

// Failures end within the timeout, with an error naming the channel and rank, instead of
// waiting forever (one GPU: the peer is a rank that never comes, or one that joined and then
// went silent before the communicator was made). Guarded: a hang here fails the test binary
// after a minute instead of holding the GPU host.
void expectFailsWithin(const char* what, const std::function<void()>& fn) {
  auto done = std::async(std::launch::async, [&]() -> std::string {
    try {
      fn();
    } catch (const comm::CommError& e) {
      return e.what();
    }
    return "";
  });
  if (done.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    std::fprintf(stderr, "[  FAILED  ] %s: still waiting after 60 s\n", what);
    std::_Exit(1);
  }
  const std::string err = done.get();
  EXPECT_NE(err, "") << what << ": no error";
  EXPECT_NE(err.find("rank"), std::string::npos) << err;
}

TEST(Gpu, NcclMissingPeerFailsWithinTheTimeout) {
  AIACC_REQUIRE_GPU();
  comm::NcclOptions o;
  o.world = 2;
  o.timeout = std::chrono::seconds(3);
  expectFailsWithin("a peer that never joins", [&] { comm::NcclTransport t(comm::makeHashStore(), o); });
}

TEST(Gpu, NcclSilentPeerAtSetUpFailsWithinTheTimeout) {
  AIACC_REQUIRE_GPU();
  comm::NcclOptions o;
  o.world = 2;
  o.timeout = std::chrono::seconds(5);
  auto store = comm::makeHashStore();
  store->set("nccl/joined/1", std::vector<uint8_t>{1});  // joined, then never makes its communicator
  expectFailsWithin("a peer silent at communicator set-up", [&] { comm::NcclTransport t(store, o); });
}

}  // namespace
}  // namespace aiacc
