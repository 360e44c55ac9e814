#include <gflags/gflags.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <unistd.h>

#include "app/amp.h"
#include "app/checkpoint.h"
#include "app/cli.h"
#include "aiacc/common/error.h"
#include "app/config.h"
#include "app/flags.h"
#include "aiacc/common/torch_compat.h"
#include "app/fused_sgd.h"
#include "app/heap.h"
#include "app/job_settings.h"
#include "app/option_names.h"
#include "app/report.h"
#include "aiacc/comm/gloo_transport.h"
#include "aiacc/comm/shm_transport.h"
#include "aiacc/comm/store.h"
#include "models/resnet.h"
#include "tests/test_util.h"

namespace aiacc::app {
namespace {

// A small fixed problem for the loss scaler: a two-layer net, its parameters and the loss.
struct TinyNet {
  torch::nn::Sequential net{torch::nn::Linear(6, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3)};
  at::Tensor x, y;
  TinyNet() {
    torch::manual_seed(4);
    net = torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
    x = torch::randn({5, 6});
    y = torch::tensor({0, 2, 1, 1, 0}, at::kLong);
  }
  // At least 3, so that loss * 2^127 overflows fp32.
  at::Tensor loss() { return 3 + 3 * torch::nn::functional::cross_entropy(net->forward(x), y); }
  std::vector<at::Tensor> grads() {
    std::vector<at::Tensor> g;
    for (auto& p : net->parameters()) g.push_back(p.grad().clone());
    return g;
  }
};

// Scaling by a power of two is exact in floating point: scaled backward then unscale gives the
// unscaled gradients bit for bit (no overflow, no denormals here).
TEST(GradScaler, PowerOfTwoScaleGivesTheUnscaledGradientsExactly) {
  TinyNet t;
  t.loss().backward();
  const auto ref = t.grads();
  t.net->zero_grad();
  GradScalerOptions o;
  o.init_scale = 1024;
  GradScaler scaler(o);
  scaler.scaleLoss(t.loss()).backward();
  EXPECT_FALSE(t.net->parameters()[0].grad().equal(ref[0])) << "backward saw the scaled loss";
  EXPECT_TRUE(scaler.unscaleAndCheck(t.net->parameters()));
  const auto got = t.grads();
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_TRUE(got[i].equal(ref[i])) << "parameter " << i;
}

// Overflow: the scaled loss is inf, the check says so, the scale backs off; after
// growth_interval good steps in a row it grows again; a disabled scaler is the identity.
TEST(GradScaler, OverflowBacksOffAndGoodStepsGrow) {
  TinyNet t;
  GradScalerOptions o;
  o.init_scale = std::ldexp(1.0, 127);  // loss (>= 3) * 2^127 overflows fp32
  o.growth_interval = 3;
  GradScaler scaler(o);
  scaler.scaleLoss(t.loss()).backward();
  EXPECT_FALSE(scaler.unscaleAndCheck(t.net->parameters()));
  scaler.update(/*found_inf=*/true);
  EXPECT_EQ(scaler.scale(), std::ldexp(1.0, 126));
  EXPECT_EQ(scaler.skippedSteps(), 1);
  // Backs off until the step is finite: the way training recovers.
  int skipped = 1;
  for (;;) {
    t.net->zero_grad();
    scaler.scaleLoss(t.loss()).backward();
    const bool finite = scaler.unscaleAndCheck(t.net->parameters());
    scaler.update(!finite);
    if (finite) break;
    ++skipped;
    ASSERT_LT(skipped, 200);
  }
  EXPECT_EQ(scaler.skippedSteps(), skipped);
  const double s = scaler.scale();
  EXPECT_EQ(s, std::ldexp(1.0, 127 - skipped));
  EXPECT_EQ(scaler.goodSteps(), 1);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), s);
  scaler.update(false);  // third good step in a row
  EXPECT_EQ(scaler.scale(), 2 * s);
  EXPECT_EQ(scaler.goodSteps(), 0);
  // A NaN anywhere counts as overflow too.
  t.net->zero_grad();
  t.loss().backward();
  t.net->parameters()[1].grad()[2] = std::nan("");
  EXPECT_FALSE(scaler.unscaleAndCheck(t.net->parameters()));

  GradScalerOptions off;
  off.enabled = false;
  GradScaler none(off);
  const at::Tensor l = t.loss();
  EXPECT_TRUE(none.scaleLoss(l).equal(l));
  EXPECT_TRUE(none.unscaleAndCheck(t.net->parameters())) << "disabled: no check";
}

// Autocast runs matmuls in the lower precision inside the scope only, nests, and restores the
// previous state; parameters stay fp32 (master weights).
TEST(Autocast, ScopeCastsMatmulsAndRestores) {
  torch::nn::Linear lin(4, 2);
  const at::Tensor x = torch::randn({3, 4});
  {
    AutocastGuard outer(true, at::kCPU, at::kBFloat16);
    EXPECT_EQ(lin->forward(x).scalar_type(), at::kBFloat16);
    {
      AutocastGuard inner(true, at::kCPU, at::kBFloat16);
      EXPECT_EQ(lin->forward(x).scalar_type(), at::kBFloat16);
    }
    EXPECT_EQ(lin->forward(x).scalar_type(), at::kBFloat16) << "the inner scope left the outer on";
    AutocastGuard disabled(false, at::kCPU, at::kBFloat16);
    EXPECT_EQ(lin->forward(x).scalar_type(), at::kBFloat16) << "a disabled guard changes nothing";
  }
  EXPECT_EQ(lin->forward(x).scalar_type(), at::kFloat);
  EXPECT_EQ(lin->weight.scalar_type(), at::kFloat);
  EXPECT_THROW(AutocastGuard(true, at::kCPU, at::kDouble), std::exception);
}

TEST(Schedule, WarmupThenShapesClosedForm) {
  Config c;
  c.lr = 0.1;
  c.epochs = 10;
  c.warmup_epochs = 2;
  c.lr_schedule = LrSchedule::kCosine;
  const int64_t gb = 512;  // linear scaling: peak 0.2
  EXPECT_DOUBLE_EQ(learningRate(c, 0.0, gb), 0.0);
  EXPECT_DOUBLE_EQ(learningRate(c, 1.0, gb), 0.1);
  EXPECT_DOUBLE_EQ(learningRate(c, 2.0, gb), 0.2);
  EXPECT_NEAR(learningRate(c, 6.0, gb), 0.1, 1e-12);  // halfway down the cosine
  EXPECT_NEAR(learningRate(c, 10.0, gb), 0.0, 1e-12);
  c.lr_schedule = LrSchedule::kLinear;
  EXPECT_NEAR(learningRate(c, 4.0, gb), 0.15, 1e-12);
  c.lr_schedule = LrSchedule::kStep;
  c.warmup_epochs = 0;
  c.lr_step_epochs = {3, 6};
  c.lr_step_gamma = 0.1;
  EXPECT_NEAR(learningRate(c, 2.9, 256), 0.1, 1e-12);
  EXPECT_NEAR(learningRate(c, 3.0, 256), 0.01, 1e-12);
  EXPECT_NEAR(learningRate(c, 7.0, 256), 0.001, 1e-12);
}

TEST(Schedule, ResizeScheduleAndStages) {
  auto st = parseResizeSchedule("0:128,10:192,14:224", 64, 0.25);
  ASSERT_EQ(st.size(), 3u);
  EXPECT_EQ(st[1].start_epoch, 10);
  EXPECT_EQ(st[1].image_size, 192);
  EXPECT_EQ(st[2].batch_size, 64);
  Config c;
  c.stages = st;
  EXPECT_EQ(stageAt(c, 0).image_size, 128);
  EXPECT_EQ(stageAt(c, 9).image_size, 128);
  EXPECT_EQ(stageAt(c, 10).image_size, 192);
  EXPECT_EQ(stageAt(c, 20).image_size, 224);
  EXPECT_THROW(parseResizeSchedule("5:128", 1, 0.1), InputError);       // must start at 0
  EXPECT_THROW(parseResizeSchedule("0:128,0:64", 1, 0.1), InputError);  // must increase
  EXPECT_THROW(parseResizeSchedule("0-128", 1, 0.1), InputError);
}

// --keep-freed-memory: after the heap settings, a 16 MiB block comes from the heap (not a fresh
// mmap), and freeing it does not hand the memory back: the next step's tensors reuse it.
TEST(Heap, FreedBlocksStayInTheHeap) {
#if defined(__GLIBC__)
  ASSERT_TRUE(aiacc::keepFreedMemoryInHeap());
  const size_t mmapped_before = mallinfo2().hblkhd;
  void* p = std::malloc(16 << 20);
  ASSERT_NE(p, nullptr);
  static_cast<volatile char*>(p)[0] = 1;
  EXPECT_EQ(mallinfo2().hblkhd, mmapped_before) << "a 16 MiB block was mmapped";
  const size_t heap_before_free = mallinfo2().arena;
  std::free(p);
  EXPECT_EQ(mallinfo2().arena, heap_before_free) << "the heap was trimmed after the free";
#else
  GTEST_SKIP() << "not glibc: keepFreedMemoryInHeap() is a no-op";
#endif
}

// SGD beside an optimizer under test: two copies of the same parameters (a 2-D weight, a bias, a
// 4-D weight in `conv_format`, and one whose gradient is missing every other step) in two groups
// (with and without weight decay), the same gradients, a learning-rate change before step 3.
struct SgdCase {
  double momentum, dampening;
  bool nesterov;
};
constexpr SgdCase kSgdCases[] = {{0.9, 0, true}, {0.9, 0, false}, {0.8, 0.3, false}, {0, 0, false}};

struct SideBySide {
  std::vector<at::Tensor> init, a, b;  // a: SGD's parameters; b: the other's
  at::Generator gen = at::detail::createCPUGenerator(11);

  explicit SideBySide(at::MemoryFormat conv_format) {
    init = {at::randn({37, 5}, gen), at::randn({13}, gen), at::randn({4, 3, 3, 3}, gen).contiguous(conv_format),
            at::randn({8}, gen)};
    for (const auto& t : init) a.push_back(t.clone().requires_grad_(true));
    for (const auto& t : init) b.push_back(t.clone().requires_grad_(true));
  }
  static std::vector<torch::optim::OptimizerParamGroup> groups(const SgdCase& c, std::vector<at::Tensor>& ps) {
    auto opts = [&](double wd) {
      return std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.1)
                                                            .momentum(c.momentum)
                                                            .dampening(c.dampening)
                                                            .nesterov(c.nesterov)
                                                            .weight_decay(wd));
    };
    std::vector<torch::optim::OptimizerParamGroup> g;
    g.emplace_back(std::vector<at::Tensor>{ps[0], ps[2]}, opts(1e-3));
    g.emplace_back(std::vector<at::Tensor>{ps[1], ps[3]}, opts(0));
    return g;
  }
  // Six steps: `ref.step()` and `other_step()`, then `check(i, step)` for each parameter.
  void run(torch::optim::SGD& ref, torch::optim::Optimizer& other, const std::function<void()>& other_step,
           const std::function<void(size_t, int)>& check) {
    for (int step = 0; step < 6; ++step) {
      for (size_t i = 0; i < a.size(); ++i) {
        const at::Tensor g = at::randn(init[i].sizes(), gen).contiguous(init[i].suggest_memory_format());
        const bool none = i == 3 && step % 2 == 1;  // sometimes no gradient at all
        a[i].mutable_grad() = none ? at::Tensor() : g.clone();
        b[i].mutable_grad() = none ? at::Tensor() : g.clone();
      }
      if (step == 3) {
        for (auto* o : {static_cast<torch::optim::Optimizer*>(&ref), &other}) {
          for (auto& pg : o->param_groups()) static_cast<torch::optim::SGDOptions&>(pg.options()).lr(0.03);
        }
      }
      ref.step();
      other_step();
      for (size_t i = 0; i < a.size(); ++i) check(i, step);
    }
  }
};

// FusedSgd takes the fused path on CPU fp32 and matches torch::optim::SGD step for step, for
// momentum with and without Nesterov, dampening, and none.
TEST(FusedSgd, MatchesLibTorchSgd) {
  for (const SgdCase& c : kSgdCases) {
    SideBySide s(at::MemoryFormat::Contiguous);
    torch::optim::SGD ref(SideBySide::groups(c, s.a), torch::optim::SGDOptions(0.1));
    aiacc::app::FusedSgd fused(SideBySide::groups(c, s.b), torch::optim::SGDOptions(0.1));
    s.run(
        ref, fused, [&] { fused.step(); },
        [&](size_t i, int step) {
      const double diff = (s.a[i] - s.b[i]).abs().max().item<double>();
      EXPECT_LE(diff, 1e-6 * (1 + s.a[i].abs().max().item<double>()))
          << "param " << i << " step " << step << " momentum " << c.momentum << " nesterov " << c.nesterov;
        });
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      EXPECT_EQ(fused.fusedSteps(), 6) << "the fused path was not taken";
    }
  }
  // Not contiguous (a transposed view as parameter): the whole step goes to SGD::step.
  at::Tensor t = at::randn({4, 6}).t().requires_grad_(true);
  t.mutable_grad() = at::ones({4, 6}).t();
  aiacc::app::FusedSgd plain(std::vector<at::Tensor>{t}, torch::optim::SGDOptions(0.5));
  const at::Tensor before = t.detach().clone();
  plain.step();
  EXPECT_EQ(plain.fusedSteps(), 0);
  EXPECT_EQ(plain.multiTensorSteps(), 0);
  EXPECT_TRUE(t.detach().allclose(before - 0.5));
}

// The multi-tensor path (FusedSgd's on a GPU) is SGD's arithmetic: on the CPU, where ATen's
// _foreach_ operations run SGD's own per-tensor kernels, equal to the bit (channels-last 4-D
// weights included), and its state is SGD's own (a checkpoint of one loads into the other).
TEST(FusedSgd, MultiTensorStepIsLibTorchSgd) {
  for (const SgdCase& c : kSgdCases) {
    SideBySide s(at::MemoryFormat::ChannelsLast);
    torch::optim::SGD ref(SideBySide::groups(c, s.a), torch::optim::SGDOptions(0.1));
    torch::optim::SGD multi(SideBySide::groups(c, s.b), torch::optim::SGDOptions(0.1));
    s.run(
        ref, multi, [&] { aiacc::app::multiTensorSgdStep(multi); },
        [&](size_t i, int step) {
      EXPECT_TRUE(s.a[i].equal(s.b[i])) << "param " << i << " step " << step << " momentum " << c.momentum
                                        << " nesterov " << c.nesterov;
        });
    for (size_t i = 0; i < s.a.size() && c.momentum != 0; ++i) {
      const auto key = aiacc::compat::optimStateKey(s.b[i]);
      ASSERT_TRUE(multi.state().count(key)) << "param " << i << ": no momentum buffer";
      const auto& mine = static_cast<torch::optim::SGDParamState&>(*multi.state().at(key)).momentum_buffer();
      const auto& theirs =
          static_cast<torch::optim::SGDParamState&>(*ref.state().at(aiacc::compat::optimStateKey(s.a[i])))
              .momentum_buffer();
      EXPECT_TRUE(mine.equal(theirs)) << "param " << i;
    }
  }
}

// One SGD+momentum step on a fixed batch.
void trainStep(models::ResNet& m, torch::optim::SGD& opt, const torch::Tensor& x, const torch::Tensor& y) {
  opt.zero_grad();
  torch::nn::functional::cross_entropy(m->forward(x), y).backward();
  opt.step();
}

TEST(Checkpoint, RoundTripContinuesIdentically) {
  test::TempDir d;
  torch::manual_seed(0);
  models::ResNetOptions o;
  o.arch = "resnet18";
  o.num_classes = 5;
  models::ResNet a(o), b(o);
  torch::optim::SGD oa(a->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD ob(b->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const torch::Tensor x = torch::randn({4, 3, 32, 32}), y = torch::tensor({0, 1, 2, 3});
  trainStep(a, oa, x, y);
  trainStep(a, oa, x, y);
  TrainingState pos;
  pos.epochs_done = 2;
  pos.step = 17;
  pos.images_seen = 1234;
  pos.elapsed_s = 56.5;
  pos.train_s = 40.25;
  pos.loss_scale = 32768.0;
  pos.loss_scale_good_steps = 11;
  saveCheckpoint(d / "c.ckpt", *a, oa, pos);
  int others = 0;
  for (auto& e : std::filesystem::directory_iterator(d.path())) others += e.path().filename() != "c.ckpt";
  EXPECT_EQ(others, 0) << "no temporary file left";
  const TrainingState got = loadCheckpoint(d / "c.ckpt", *b, ob);
  EXPECT_EQ(got.epochs_done, 2);
  EXPECT_EQ(got.step, 17);
  EXPECT_EQ(got.images_seen, 1234);
  EXPECT_DOUBLE_EQ(got.elapsed_s, 56.5);
  EXPECT_DOUBLE_EQ(got.train_s, 40.25);
  EXPECT_DOUBLE_EQ(got.loss_scale, 32768.0) << "the AMP loss scale resumes where it was";
  EXPECT_EQ(got.loss_scale_good_steps, 11);
  // Momentum buffers came back too: one more step gives identical parameters.
  trainStep(a, oa, x, y);
  trainStep(b, ob, x, y);
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_TRUE(pa[i].value().equal(pb[i].value())) << pa[i].key();
  }
  auto ba = a->named_buffers(), bb = b->named_buffers();
  for (size_t i = 0; i < ba.size(); ++i) ASSERT_TRUE(ba[i].value().equal(bb[i].value())) << ba[i].key();
}

TEST(Checkpoint, UnreadableIsAClearError) {
  test::TempDir d;
  models::ResNetOptions o;
  o.arch = "resnet18";
  o.num_classes = 5;
  models::ResNet m(o);
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_THROW(loadCheckpoint(d / "missing.ckpt", *m, opt), InputError);
  test::writeText(d / "junk.ckpt", "definitely not a checkpoint");
  try {
    loadCheckpoint(d / "junk.ckpt", *m, opt);
    FAIL() << "junk checkpoint accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot read checkpoint"), std::string::npos);
  }
  // A checkpoint of another model is an error too, not a silent partial load.
  saveCheckpoint(d / "m.ckpt", *m, opt, TrainingState{});
  o.num_classes = 6;
  models::ResNet other(o);
  torch::optim::SGD other_opt(other->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_THROW(loadCheckpoint(d / "m.ckpt", *other, other_opt), IoError);
}

TEST(Checkpoint, FullDiskKeepsThePreviousCheckpoint) {
  test::TempDir d;
  const std::string mnt = d / "small";
  std::filesystem::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=2m") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here (needs root): full-disk case not exercised";
  }
  struct Unmount {
    std::string p;
    ~Unmount() { ::umount(p.c_str()); }
  } unmount{mnt};
  models::ResNetOptions o;
  o.arch = "resnet18";
  o.num_classes = 2;
  models::ResNet m(o);  // ~45 MB of parameters: cannot fit in 2 MB
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1));
  test::writeText(mnt + "/last.ckpt", "previous checkpoint");
  EXPECT_THROW(saveCheckpoint(mnt + "/last.ckpt", *m, opt, TrainingState{}), IoError);
  EXPECT_EQ(test::readText(mnt + "/last.ckpt"), "previous checkpoint");
  int leftovers = 0;
  for (auto& e : std::filesystem::directory_iterator(mnt)) leftovers += e.path().filename() != "last.ckpt";
  EXPECT_EQ(leftovers, 0) << "temporary file removed";
}

}  // namespace
}  // namespace aiacc::app
