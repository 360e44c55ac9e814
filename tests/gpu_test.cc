// GPU tests, for a machine with a GPU and a CUDA LibTorch (scripts/gpu/check.sh runs them).
// Compiled into aiacc_tests in a CUDA build with NCCL; elsewhere the build compiles it against the
// CUDA and NCCL headers (aiacc_gpu_sources_check, tests/CMakeLists.txt) so it cannot rot unseen;
// without a visible GPU every test skips.
// One GPU allows NCCL world size 1 only, where a collective that did nothing would leave
// in-place buffers as they were: so each assertion is one a no-op fails (out-of-place outputs
// poisoned first, exact bytes and measured busy time per channel, .grad poisoned before
// DataParallel writes the reduced gradients back, references computed independently, on the
// CPU by two ranks over shared memory). With two or more GPUs, two NCCL ranks (threads, one
// GPU each) check the sums themselves. Also: stream ordering, errors reaching the host, the
// cast and unscale kernels, the device-side input normalization, the trainer with AMP and
// channels-last.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <cuda_runtime_api.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "app/amp.h"
#include "app/fused_sgd.h"
#include "app/trainer.h"
#include "aiacc/comm/data_parallel.h"
#include "aiacc/comm/nccl_transport.h"
#include "aiacc/comm/transport.h"
#include "aiacc/comm/store.h"
#include "data/device_input.h"
#include "tests/checkpoint_tensors.h"
#include "tests/comm_test_util.h"
#include "tests/json_util.h"
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

double bytesOf(const comm::Transport& t) {
  double b = 0;
  for (int c = 0; c < t.channels(); ++c) b += t.channelStats(c).bytes;
  return b;
}

// Every collective, on device and host tensors, in each dtype DataParallel sends. World 1: the
// results are the inputs; the out-of-place output starts as NaN, and each channel's statistics
// count exactly the bytes submitted to it, with measured busy time: what only operations that
// ran through NCCL produce.
TEST(Gpu, NcclTransportRoundTrip) {
  AIACC_REQUIRE_GPU();
  auto t = ncclWorldOne(2);
  EXPECT_EQ(t->channels(), 2);
  std::vector<double> submitted(2, 0.0);
  for (at::ScalarType dt : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (int ch = 0; ch < 2; ++ch) {
      const at::Tensor ref = at::arange(1001, cuda(at::kFloat)).to(dt);
      at::Tensor x = ref.clone();
      t->allreduce(x, comm::ReduceOp::kSum, ch)->wait();
      EXPECT_TRUE(x.equal(ref));
      t->broadcast(x, 0, ch)->wait();
      EXPECT_TRUE(x.equal(ref));
      at::Tensor out = at::full_like(ref, std::numeric_limits<float>::quiet_NaN());
      t->allgather(x, out, ch)->wait();
      EXPECT_TRUE(out.equal(ref));
      t->reduceScatter(x, ch)->wait();
      t->allgatherShards(x, ch)->wait();
      EXPECT_TRUE(x.equal(ref));
      submitted[static_cast<size_t>(ch)] += 5.0 * static_cast<double>(ref.nbytes());
    }
  }
  at::Tensor host = at::arange(10, at::kLong);  // control traffic: staged through the device
  t->allreduce(host, comm::ReduceOp::kBitwiseOr, 0)->wait();
  EXPECT_TRUE(host.equal(at::arange(10, at::kLong)));
  submitted[0] += static_cast<double>(host.nbytes());  // world 1: the gathered copy is as large
  t->synchronize();
  for (int ch = 0; ch < 2; ++ch) {
    const comm::ChannelStats s = t->channelStats(ch);
    EXPECT_EQ(s.bytes, submitted[static_cast<size_t>(ch)]) << "channel " << ch;
    EXPECT_GT(s.busy_s, 0) << "channel " << ch << ": TORCH_NCCL_ENABLE_TIMING=1 (tests/test_main.cc) times them";
  }
}

// After a failure (here abort(), as the transport itself does when ProcessGroupNCCL's watchdog
// reports one) the host hears of it where it blocks: synchronize(), a device tensor's
// synchronize(), a host tensor's wait(), and every later submission; never a silent success.
TEST(Gpu, NcclErrorsReachTheHost) {
  AIACC_REQUIRE_GPU();
  auto t = ncclWorldOne(1);
  at::Tensor x = at::ones({1 << 20}, cuda());
  auto w = t->allreduce(x, comm::ReduceOp::kSum, 0);
  t->abort("test: the job is lost");
  auto raises = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const comm::CommError& e) {
      return std::string(e.what()).find("test: the job is lost") != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(raises([&] { w->synchronize(); }));
  EXPECT_TRUE(raises([&] { t->synchronize(); }));
  EXPECT_TRUE(raises([&] { t->allreduce(x, comm::ReduceOp::kSum, 0); }));
  at::Tensor host = at::ones({4});
  EXPECT_TRUE(raises([&] { t->allreduce(host, comm::ReduceOp::kSum, 0)->wait(); }));
}

// The elastic path's NCCL contract at world 1 (one GPU holds one NCCL rank): a transport whose
// collectives are in flight is aborted, its operations raise instead of hanging, it is destroyed,
// and a new one is made in the same process, 20 times. Each cycle takes seconds at most, the
// process is never aborted, and the device memory a cycle leaves behind does not grow: the free
// memory the driver reports (NCCL's own buffers included, the caching allocator emptied) after
// the last cycle is within 64 MiB of that after the second.
TEST(Gpu, NcclAbortAndRecreateTwentyTimes) {
  AIACC_REQUIRE_GPU();
  using Clock = std::chrono::steady_clock;
  auto freeBytes = [] {
    torch::cuda::synchronize();
    c10::cuda::CUDACachingAllocator::emptyCache();
    size_t free = 0, total = 0;
    EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
    return static_cast<double>(free);
  };
  std::vector<double> seconds, free_after;
  for (int cycle = 0; cycle < 20; ++cycle) {
    const auto t0 = Clock::now();
    {
      auto t = ncclWorldOne(2);
      at::Tensor x = at::ones({16 << 20}, cuda());  // 64 MiB
      t->allreduce(x, comm::ReduceOp::kSum, 0)->wait();
      t->synchronize();
      EXPECT_EQ(x.sum().item<double>(), static_cast<double>(16 << 20)) << "cycle " << cycle;
      std::vector<std::shared_ptr<comm::Work>> inflight;
      for (int k = 0; k < 4; ++k) inflight.push_back(t->allreduce(x, comm::ReduceOp::kSum, k % 2));
      t->abort(strCat("test: cycle ", cycle, " lost a peer"));
      for (auto& w : inflight) {
        bool raised = false;
        try {
          w->synchronize();
        } catch (const comm::CommError& e) {
          raised = std::string(e.what()).find("lost a peer") != std::string::npos;
        }
        EXPECT_TRUE(raised) << "cycle " << cycle << ": an operation of an aborted transport completed silently";
      }
    }
    seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    free_after.push_back(freeBytes());
  }
  std::string line = "abort and re-create, seconds per cycle:";
  for (double s : seconds) line += strCat(" ", static_cast<int>(s * 1000), "ms");
  std::printf("%s\nfree device memory after cycles 2 / 10 / 20: %.1f / %.1f / %.1f MiB\n", line.c_str(),
              free_after[1] / (1 << 20), free_after[9] / (1 << 20), free_after[19] / (1 << 20));
  for (size_t i = 0; i < seconds.size(); ++i) EXPECT_LT(seconds[i], 30.0) << "cycle " << i;
  EXPECT_GE(free_after[19], free_after[1] - 64.0 * (1 << 20)) << "device memory grows with each cycle";
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

// FusedSgd on the GPU takes the multi-tensor path, and its weights and momentum follow
// torch::optim::SGD's on the same device over five steps (channels-last weights, weight decay,
// Nesterov): the _foreach_ kernels may round a fused multiply-add differently, so the
// difference is bounded (and printed) rather than zero.
TEST(Gpu, FusedSgdTakesTheMultiTensorPathLikeSgd) {
  AIACC_REQUIRE_GPU();
  auto gen = at::detail::createCPUGenerator(5);
  std::vector<at::Tensor> init = {at::randn({64, 32, 3, 3}, gen), at::randn({64}, gen), at::randn({1000, 2048}, gen)};
  auto make = [&] {
    std::vector<at::Tensor> ps;
    for (const auto& t : init) {
      at::Tensor d = t.to(at::kCUDA);
      if (d.dim() == 4) d = d.contiguous(at::MemoryFormat::ChannelsLast);
      ps.push_back(d.requires_grad_(true));
    }
    return ps;
  };
  std::vector<at::Tensor> a = make(), b = make();
  const auto opts = torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(5e-5);
  torch::optim::SGD ref(a, opts);
  app::FusedSgd fused(b, opts);
  double largest = 0;
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < a.size(); ++i) {
      const at::Tensor g = at::randn(init[i].sizes(), gen).to(at::kCUDA).contiguous(a[i].suggest_memory_format());
      a[i].mutable_grad() = g.clone();
      b[i].mutable_grad() = g.clone();
    }
    ref.step();
    fused.step();
    for (size_t i = 0; i < a.size(); ++i) {
      largest = std::max(largest, (a[i] - b[i]).abs().max().item<double>() / (1 + a[i].abs().max().item<double>()));
    }
  }
  std::printf("multi-tensor SGD on the GPU: largest relative difference from SGD after 5 steps %.3g\n", largest);
  EXPECT_EQ(fused.multiTensorSteps(), 5);
  EXPECT_LE(largest, 1e-6);
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

torch::nn::Sequential convNet(bool batch_norm = true) {
  namespace nn = torch::nn;
  nn::Sequential s(nn::Conv2d(nn::Conv2dOptions(3, 16, 3).padding(1).bias(!batch_norm)));
  if (batch_norm) s->push_back(nn::BatchNorm2d(16));
  s->push_back(nn::ReLU());
  s->push_back(nn::Conv2d(nn::Conv2dOptions(16, 32, 3).stride(2).padding(1)));
  s->push_back(nn::ReLU());
  s->push_back(nn::AdaptiveAvgPool2d(1));
  s->push_back(nn::Flatten());
  s->push_back(nn::Linear(32, 10));
  return s;
}

void copyParameters(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto a = from.parameters(), b = to.parameters();
  for (size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
}

int64_t parameterCount(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

// DataParallel over NCCL (world 1, several small buckets on two channels, backward on a side
// stream): the gradients written back equal plain backward's, computed on another copy of the
// model, to rounding in fp32 (cuDNN's backward may sum in another order between two runs) and
// within fp16 rounding with fp16 transfer (cast and unscale on the device). After backward the
// buckets hold the gradients, so .grad is poisoned (NaN) before finishBackward(): only the
// reduced values written back pass; and the channels carried exactly every bucket's wire bytes
// and striping's rate exchange (seen on the H200: 16 bytes beyond the buckets).
TEST(Gpu, DataParallelOverNcclGivesTheLocalGradients) {
  AIACC_REQUIRE_GPU();
  at::globalContext().setDeterministicCuDNN(true);
  for (comm::TransferDtype transfer : {comm::TransferDtype::kFloat32, comm::TransferDtype::kFloat16}) {
    torch::manual_seed(3);
    auto ref = convNet();
    ref->to(at::kCUDA);
    auto net = convNet();
    net->to(at::kCUDA);
    copyParameters(*ref, *net);
    const at::Tensor x = at::randn({8, 3, 32, 32}, cuda());
    const at::Tensor y = at::randint(0, 10, {8}, cuda(at::kLong));
    torch::nn::functional::cross_entropy(ref->forward(x), y).backward();

    comm::DataParallelOptions o;
    o.reducer.bucket_mb = 0.005;  // several buckets
    o.reducer.first_bucket_mb = 0.001;
    o.striping.channels = 2;
    o.codec.dtype = transfer;
    o.autotune = false;
    o.buffers = comm::BufferSync::kAverageWhenRead;  // nothing travels in beforeForward()
    o.reducer.rebuild_after_first_step = false;      // nor after the step
    auto transport = ncclWorldOne(2);
    comm::DataParallel dp(net.ptr(), transport, comm::WorldInfo{}, o);
    EXPECT_GT(dp.plan().buckets.size(), 2u);
    transport->synchronize();
    const double bytes_before = bytesOf(*transport);
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
    {
      c10::cuda::CUDAStreamGuard guard(side);
      dp.beforeForward();
      torch::nn::functional::cross_entropy(net->forward(x), y).backward();
      for (auto& p : net->parameters()) p.mutable_grad().fill_(std::numeric_limits<float>::quiet_NaN());
      ASSERT_TRUE(dp.finishBackward());
      dp.synchronize();
    }
    // Besides the buckets, striping's rate exchange after the step: one double per channel.
    const double wire_bytes = transfer == comm::TransferDtype::kFloat32 ? 4.0 : 2.0;
    EXPECT_EQ(bytesOf(*transport) - bytes_before, wire_bytes * static_cast<double>(parameterCount(*net)) + 8.0 * 2);
    auto a = ref->parameters(), b = net->parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(at::isfinite(b[i].grad()).all().item<bool>()) << "parameter " << i << " was not written back";
      if (transfer == comm::TransferDtype::kFloat32) {
        EXPECT_TRUE(at::allclose(b[i].grad(), a[i].grad(), 1e-5, 1e-7)) << "parameter " << i;
      } else {
        const float bound = 2e-3f * a[i].grad().abs().max().item<float>() + 1e-6f;
        EXPECT_LE((b[i].grad() - a[i].grad()).abs().max().item<float>(), bound) << "parameter " << i;
      }
    }
  }
}

// Beside the NCCL rank, two CPU ranks over shared memory, each with half of the batch: their
// averaged gradients (a real reduction) equal the GPU rank's full-batch gradients, to the
// rounding of cuDNN against the CPU kernels. (No BatchNorm: halves have other batch statistics.)
TEST(Gpu, DataParallelOverNcclMatchesTwoCpuRanks) {
  AIACC_REQUIRE_GPU();
  torch::manual_seed(4);
  auto gpu_net = convNet(false);
  std::vector<torch::nn::Sequential> cpu_nets{convNet(false), convNet(false)};
  for (auto& n : cpu_nets) copyParameters(*gpu_net, *n);
  gpu_net->to(at::kCUDA);
  const at::Tensor x = at::randn({8, 3, 16, 16});
  const at::Tensor y = at::randint(0, 10, {8}, at::kLong);
  comm::DataParallelOptions o;
  o.reducer.bucket_mb = 0.005;
  o.reducer.first_bucket_mb = 0.001;
  o.autotune = false;
  {
    comm::DataParallel dp(gpu_net.ptr(), ncclWorldOne(1), comm::WorldInfo{}, o);
    torch::nn::functional::cross_entropy(gpu_net->forward(x.to(at::kCUDA)), y.to(at::kCUDA)).backward();
    ASSERT_TRUE(dp.finishBackward());
    dp.synchronize();
  }
  comm::test::expectNoErrors(comm::test::runRanks(
      2,
      [&](int r, std::shared_ptr<comm::Transport> t) {
    comm::DataParallel dp(cpu_nets[static_cast<size_t>(r)].ptr(), t, comm::WorldInfo{r, 2, r, 2}, o);
    const at::Tensor xr = x.narrow(0, 4 * r, 4), yr = y.narrow(0, 4 * r, 4);
    torch::nn::functional::cross_entropy(cpu_nets[static_cast<size_t>(r)]->forward(xr), yr).backward();
    if (!dp.finishBackward()) throw std::runtime_error("step skipped");
      },
      /*channels=*/1, std::chrono::seconds(30), /*ranks_per_node=*/0, /*shm=*/true));
  auto g = gpu_net->parameters();
  for (int r = 0; r < 2; ++r) {
    auto c = cpu_nets[static_cast<size_t>(r)]->parameters();
    for (size_t i = 0; i < g.size(); ++i) {
      EXPECT_TRUE(at::allclose(c[i].grad(), g[i].grad().cpu(), 1e-4, 1e-6)) << "rank " << r << ", parameter " << i;
    }
  }
}

// Two NCCL ranks, threads on two GPUs (skipped on a host with one): the sums themselves, for
// every collective, uneven shards included, and DataParallel's average of different batches.
TEST(Gpu, NcclTwoRanksReduceAcrossGpus) {
  AIACC_REQUIRE_GPU();
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "two NCCL ranks need two GPUs; this host has one";
  auto store = comm::makeHashStore();
  const int64_t n = 1001;  // odd: uneven shards
  comm::test::expectNoErrors(comm::test::runThreads(2, [&](int r) {
    c10::cuda::CUDAGuard device(static_cast<c10::DeviceIndex>(r));
    const at::TensorOptions on = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, r);
    comm::NcclOptions no;
    no.rank = r;
    no.world = 2;
    no.device = r;
    no.timeout = std::chrono::seconds(30);
    auto t = std::make_shared<comm::NcclTransport>(store, no);
    const at::Tensor base = at::arange(n, on);
    at::Tensor x = base * (r + 1);
    t->allreduce(x, comm::ReduceOp::kSum, 0)->wait();
    if (!x.equal(base * 3)) throw std::runtime_error("allreduce");
    x = base * (r + 1);
    t->reduceScatter(x, 0)->wait();
    const comm::Shard mine = comm::shardOf(n, 2, r);
    if (!x.narrow(0, mine.offset, mine.count).equal((base * 3).narrow(0, mine.offset, mine.count)))
      throw std::runtime_error("reduce-scatter");
    at::Tensor sharded = at::full({n}, std::numeric_limits<float>::quiet_NaN(), on);
    sharded.narrow(0, mine.offset, mine.count).copy_(base.narrow(0, mine.offset, mine.count));
    t->allgatherShards(sharded, 0)->wait();
    if (!sharded.equal(base)) throw std::runtime_error("allgather of shards");
    at::Tensor out = at::full({2 * n}, std::numeric_limits<float>::quiet_NaN(), on);
    t->allgather(base + r, out, 0)->wait();
    if (!out.equal(at::cat({base, base + 1}))) throw std::runtime_error("allgather");
    at::Tensor b = base + r;
    t->broadcast(b, 1, 0)->wait();
    if (!b.equal(base + 1)) throw std::runtime_error("broadcast");
    at::Tensor host = at::full({3}, int64_t{1} << r, at::kLong);
    t->allreduce(host, comm::ReduceOp::kBitwiseOr, 0)->wait();
    if (!host.equal(at::full({3}, int64_t{3}, at::kLong))) throw std::runtime_error("bitwise or");

    // One batch of 8, the same on both ranks (their own generators: the threads share the global
    // one); each rank takes its half. DataParallel starts both from rank 0's weights.
    const at::Tensor xs = at::randn({8, 3, 16, 16}, at::detail::createCPUGenerator(7), at::kFloat);
    const at::Tensor ys = at::randint(0, 10, {8}, at::detail::createCPUGenerator(8), at::kLong);
    auto net = convNet(false);
    net->to(at::Device(at::kCUDA, r));
    comm::DataParallelOptions o;
    o.autotune = false;
    comm::DataParallel dp(net.ptr(), t, comm::WorldInfo{r, 2, r, 2}, o);
    auto ref = convNet(false);
    ref->to(at::Device(at::kCUDA, r));
    copyParameters(*net, *ref);
    torch::nn::functional::cross_entropy(net->forward(xs.narrow(0, 4 * r, 4).to(on.device())),
                                         ys.narrow(0, 4 * r, 4).to(on.device()))
        .backward();
    if (!dp.finishBackward()) throw std::runtime_error("step skipped");
    dp.synchronize();
    torch::nn::functional::cross_entropy(ref->forward(xs.to(on.device())), ys.to(on.device())).backward();
    auto a = ref->parameters(), g = net->parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      if (!at::allclose(g[i].grad(), a[i].grad(), 1e-4, 1e-6)) throw std::runtime_error(strCat("parameter ", i));
    }
  }));
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

// Preemption on one GPU under AMP fp16 (dynamic loss scaler) and channels-last, without cuDNN's
// benchmarking and with its deterministic algorithms: a stop at step 27 saves the loss scale and
// the CUDA generator's state, and --resume auto continues from them. Two uninterrupted runs are
// compared first. Where they agree to the bit, the stopped-and-resumed run must too (parameters,
// BN statistics, momentum, per-step losses, the final scale); where they do not, the difference
// the resume makes is printed beside the run-to-run one and must not exceed it.
TEST(Gpu, StopUnderAmpFp16AndResumeContinuesTheRun) {
  AIACC_REQUIRE_GPU();
  at::globalContext().setDeterministicCuDNN(true);
  test::TempDir dir;
  test::makeLearnableSample(dir / "ds");
  auto config = [&](const std::string& name) {
    app::Config c = test::learnableConfig(dir / "ds");
    c.epochs = 2;  // 20 steps each
    c.cuda = true;
    c.amp = true;
    c.amp_dtype = app::AmpDtype::kFp16;
    c.channels_last = true;
    c.cudnn_benchmark = false;
    c.checkpoint_dir = dir / name;
    c.metrics_file = dir / (name + ".jsonl");
    return c;
  };
  const app::Report whole = app::Trainer(config("whole"), {}, app::localSync(), app::Trainer::Clock::now()).run();
  app::Trainer(config("again"), {}, app::localSync(), app::Trainer::Clock::now()).run();
  ASSERT_EQ(whole.steps, 40);
  ASSERT_GT(whole.loss_scale, 0);

  app::Config first = config("parts");
  app::Trainer interrupted(first, {}, app::localSync(), app::Trainer::Clock::now());
  int polls = 0;  // once a step, and once per batch of epoch 1's evaluation (5 of 16 images)
  interrupted.setStopRequest([&] { return ++polls >= 20 + 5 + 7 ? SIGTERM : 0; });
  const app::Report part = interrupted.run();
  ASSERT_TRUE(part.preempted);
  ASSERT_EQ(part.saved_step, 27);
  const c10::impl::GenericDict saved =
      models::readTorchSave(part.checkpoint).value.toGenericDict().at("training_state").toGenericDict();
  EXPECT_TRUE(saved.at("rng_cuda").isTensor()) << "the CUDA generator's state is saved";
  EXPECT_EQ(models::realOf(saved.at("loss_scale"), "loss_scale"), part.loss_scale);
  app::Config second = first;
  second.resume = "auto";
  const app::Report rest = app::Trainer(second, {}, app::localSync(), app::Trainer::Clock::now()).run();
  ASSERT_EQ(rest.steps, 40);

  const auto losses = test::metricValues(dir / "whole.jsonl", "step", "loss");
  const auto losses_again = test::metricValues(dir / "again.jsonl", "step", "loss");
  const auto losses_parts = test::metricValues(dir / "parts.jsonl", "step", "loss");
  const std::string w = test::newestCheckpoint(dir / "whole"), a = test::newestCheckpoint(dir / "again"),
                    p = test::newestCheckpoint(dir / "parts");
  const double run_to_run = test::largestDifference(w, a, 8), resumed = test::largestDifference(w, p, 8);
  std::printf("GPU resume under AMP fp16: loss scale %g (uninterrupted %g); largest difference from the "
              "uninterrupted run: resumed %.3g, a second uninterrupted run %.3g; per-step losses %s\n",
              rest.loss_scale, whole.loss_scale, resumed, run_to_run, losses_parts == losses ? "equal" : "differ");
  if (run_to_run == 0 && losses_again == losses) {
    EXPECT_EQ(losses_parts, losses);
    test::expectSameTensors(w, p, 8);
    EXPECT_EQ(rest.loss_scale, whole.loss_scale);
  } else {
    EXPECT_LE(resumed, run_to_run) << "the resume adds a difference of its own";
  }
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
