// aiacc_checkpoint_tool: writes and verifies a checkpoint whose every value is known in closed
// form, so that one build (LibTorch 1.13, say) writes it and another (2.x) checks what it resumes,
// exactly, with no training kernels in between whose results could differ by version.
//   aiacc_checkpoint_tool write PATH     a checkpoint as saveCheckpoint writes it (format 5)
//   aiacc_checkpoint_tool verify PATH    exit 0 when every value is as written
// The state: resnet18 with 5 classes; parameter i's element k = sin(1000 i + k) (as float), BN
// running statistics likewise, two parameter groups (weights with weight decay and Nesterov,
// the rest without), momentum buffers cos(1000 i + k) on every second parameter only (a
// parameter without a buffer must stay without one), and a fixed training position.
#include <torch/optim/sgd.h>
#include <torch/version.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "app/checkpoint.h"
#include "app/optim_state.h"
#include "models/torch_unpickler.h"
#include "models/weights.h"
#include "aiacc/common/torch_compat.h"
#include "models/resnet.h"

namespace {

using aiacc::app::EvalPoint;
using aiacc::app::TrainingState;

// Every field, with values that survive the trip exactly.
TrainingState position() {
  TrainingState p;
  p.epochs_done = 3;
  p.step = 123;
  p.images_seen = 4567;
  p.elapsed_s = 89.5;
  p.train_s = 70.25;
  p.loss_scale = 16384.0;
  p.loss_scale_good_steps = 7;
  p.batches_in_epoch = 9;
  p.skipped_steps = 2;
  p.checkpoint_failures = 1;
  aiacc::app::EvalPoint e;
  e.step = 100;
  e.epoch = 2.5;
  e.seconds = 80.25;
  e.top1 = 51.5;
  e.top5 = 80.75;
  e.loss = 1.625;
  e.images = 500;
  p.evals = {e, e};
  p.evals[1].step = 120;
  p.target_reached = true;
  p.time_to_target_s = 80.25;
  p.settings = {{"--seed", "5"}, {"dataset", "4 classes (names 1a2b), 10 train and 2 val files"}};
  p.rng_cpu = at::arange(64, at::kByte);
  p.rank_local_buffers = true;
  p.classes = {"n01440764", "n01443537", "caf\xc3\xa9", "d", "e"};
  p.config = {{"arch", "resnet18"}, {"lr", "0.25"}, {"data", "/data/imagenet"}};
  p.comm.transfer_scale = 2048.0;
  p.comm.transfer_good_steps = 5;
  p.comm.tuned = aiacc::comm::TuneConfig{8, 2, true};
  p.comm.channel_weights = {0.625, 0.375};
  p.comm.bucket_order = {3, 1, 0, 2};
  p.rng_cuda = at::arange(16, at::kByte) * 3;
  return p;
}
const TrainingState kPosition = position();

bool sameEvals(const std::vector<aiacc::app::EvalPoint>& a, const std::vector<aiacc::app::EvalPoint>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].step != b[i].step || a[i].epoch != b[i].epoch || a[i].seconds != b[i].seconds || a[i].top1 != b[i].top1 ||
        a[i].top5 != b[i].top5 || a[i].loss != b[i].loss || a[i].images != b[i].images)
      return false;
  }
  return true;
}

at::Tensor closedForm(int64_t i, const at::Tensor& like, bool cosine) {
  const int64_t n = like.numel();
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    const double x = 1000.0 * static_cast<double>(i) + static_cast<double>(k);
    v[static_cast<size_t>(k)] = static_cast<float>(cosine ? std::cos(x) : std::sin(x));
  }
  return torch::from_blob(v.data(), like.sizes(), at::kFloat).clone();
}

struct Fixture {
  aiacc::models::ResNet model{nullptr};
  std::unique_ptr<torch::optim::SGD> sgd;
};

// The model and optimizer before any value is set: parameters split into two groups by rank.
Fixture blank() {
  aiacc::models::ResNetOptions o;
  o.arch = "resnet18";
  o.num_classes = 5;
  Fixture f;
  f.model = aiacc::models::ResNet(o);
  std::vector<at::Tensor> decay, rest;
  for (const auto& p : f.model->parameters()) (p.dim() > 1 ? decay : rest).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::SGDOptions>(
                                 torch::optim::SGDOptions(0.25).momentum(0.9).nesterov(true).weight_decay(5e-5)));
  groups.emplace_back(
      rest, std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.125).momentum(0.8).dampening(0.1)));
  f.sgd = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(1.0));
  return f;
}

// The closed-form state, set into a blank fixture.
Fixture expected() {
  Fixture f = blank();
  torch::NoGradGuard no_grad;
  int64_t i = 0;
  for (auto& p : f.model->parameters()) p.copy_(closedForm(i++, p, false));
  for (auto& b : f.model->buffers()) {
    if (b.scalar_type() == at::kLong) {
      b.fill_(i++);
    } else {
      b.copy_(closedForm(i++, b, false).abs());
    }
  }
  i = 0;
  for (auto& g : f.sgd->param_groups()) {
    for (auto& p : g.params()) {
      if (i % 2 == 0) {
        auto st = std::make_unique<torch::optim::SGDParamState>();
        st->momentum_buffer(closedForm(i, p, true));
        f.sgd->state()[aiacc::compat::optimStateKey(p)] = std::move(st);
      }
      ++i;
    }
  }
  return f;
}

int fail(const std::string& what) {
  std::fprintf(stderr, "aiacc_checkpoint_tool (LibTorch %s): %s\n", TORCH_VERSION, what.c_str());
  return 1;
}

int verify(const std::string& path) {
  Fixture want = expected();
  Fixture got = blank();
  const TrainingState pos = aiacc::app::loadCheckpoint(path, *got.model, *got.sgd);
  const TrainingState& k = kPosition;
  if (pos.epochs_done != k.epochs_done || pos.step != k.step || pos.images_seen != k.images_seen ||
      pos.elapsed_s != k.elapsed_s || pos.train_s != k.train_s || pos.loss_scale != k.loss_scale ||
      pos.loss_scale_good_steps != k.loss_scale_good_steps) {
    return fail("the training position differs");
  }
  if ((pos.classes != k.classes || pos.config != k.config)) {
    return fail("the class names or the configuration differ");
  }
  if ((pos.comm.transfer_scale != k.comm.transfer_scale || pos.comm.transfer_good_steps != k.comm.transfer_good_steps ||
       pos.comm.tuned != k.comm.tuned || pos.comm.channel_weights != k.comm.channel_weights ||
       pos.comm.bucket_order != k.comm.bucket_order)) {
    return fail("the communication state (fp16 transfer's scale, the tuner's choice, shares, bucket order) or the CUDA "
                "generator state differs");
  }
  if ((pos.batches_in_epoch != k.batches_in_epoch || pos.skipped_steps != k.skipped_steps ||
       pos.checkpoint_failures != k.checkpoint_failures || !sameEvals(pos.evals, k.evals) ||
       pos.target_reached != k.target_reached || pos.time_to_target_s != k.time_to_target_s ||
       pos.settings != k.settings || !pos.rng_cpu.defined() || !pos.rng_cpu.equal(k.rng_cpu) ||
       pos.rank_local_buffers != k.rank_local_buffers)) {
    return fail("the training state (mid-epoch position, history, settings, RNG) differs");
  }
  const auto wp = want.model->named_parameters(), gp = got.model->named_parameters();
  for (size_t i = 0; i < wp.size(); ++i) {
    if (!wp[i].value().equal(gp[i].value())) return fail("parameter " + wp[i].key() + " differs");
  }
  const auto wb = want.model->named_buffers(), gb = got.model->named_buffers();
  for (size_t i = 0; i < wb.size(); ++i) {
    if (!wb[i].value().equal(gb[i].value())) return fail("buffer " + wb[i].key() + " differs");
  }
  const auto& wg = want.sgd->param_groups();
  const auto& gg = got.sgd->param_groups();
  size_t with_buffer = 0;
  for (size_t g = 0; g < wg.size(); ++g) {
    const auto& wo = static_cast<const torch::optim::SGDOptions&>(wg[g].options());
    const auto& go = static_cast<const torch::optim::SGDOptions&>(gg[g].options());
    if (!(wo == go)) return fail("the options of parameter group " + std::to_string(g) + " differ");
    for (size_t j = 0; j < wg[g].params().size(); ++j) {
      const auto wi = want.sgd->state().find(aiacc::compat::optimStateKey(wg[g].params()[j]));
      const auto gi = got.sgd->state().find(aiacc::compat::optimStateKey(gg[g].params()[j]));
      const std::string where = "group " + std::to_string(g) + " parameter " + std::to_string(j);
      if ((wi == want.sgd->state().end()) != (gi == got.sgd->state().end())) {
        return fail("momentum buffer present in one state only: " + where);
      }
      if (wi == want.sgd->state().end()) continue;
      const auto& wm = static_cast<const torch::optim::SGDParamState&>(*wi->second).momentum_buffer();
      const auto& gm = static_cast<const torch::optim::SGDParamState&>(*gi->second).momentum_buffer();
      if (!wm.equal(gm)) return fail("momentum buffer differs: " + where);
      ++with_buffer;
    }
  }
  if (with_buffer == 0) return fail("no momentum buffer was checked");
  std::printf("aiacc_checkpoint_tool (LibTorch %s): %s resumes exactly: %zu parameters, %zu buffers, "
              "%zu momentum buffers, options of %zu groups, the whole training state\n",
              TORCH_VERSION, path.c_str(), wp.size(), wb.size(), with_buffer, wg.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage = "usage: aiacc_checkpoint_tool write PATH | verify PATH";
  if (argc < 3) return fail(usage);
  const std::string cmd = argv[1], path = argv[2];
  try {
    if (cmd == "verify" && argc == 3) return verify(path);
    if (cmd == "write" && argc == 3) {
      Fixture f = expected();
      aiacc::app::saveCheckpoint(path, *f.model, *f.sgd, kPosition);
      std::printf("aiacc_checkpoint_tool (LibTorch %s): wrote %s\n", TORCH_VERSION, path.c_str());
      return 0;
    }
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return fail(usage);
}
