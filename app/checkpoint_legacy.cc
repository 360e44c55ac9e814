#include "app/checkpoint_legacy.h"

#include <torch/nn/module.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>

#include <cmath>
#include <sstream>

#include "app/optim_state.h"
#include "aiacc/common/error.h"
#include "models/weights.h"

namespace aiacc::app {
namespace {

std::vector<std::pair<std::string, std::string>> settingsFrom(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto tab = line.find('\t');
    AIACC_CHECK_INPUT(tab != std::string::npos, "settings line without a tab: '", line, "'");
    out.emplace_back(line.substr(0, tab), line.substr(tab + 1));
  }
  return out;
}

}  // namespace

at::Tensor evalsTensor(const std::vector<EvalPoint>& evals) {
  at::Tensor t = at::zeros({static_cast<int64_t>(evals.size()), 7}, at::kDouble);
  double* v = t.data_ptr<double>();
  for (const EvalPoint& e : evals) {
    for (double x :
         {static_cast<double>(e.step), e.epoch, e.seconds, e.top1, e.top5, e.loss, static_cast<double>(e.images)})
      *v++ = x;
  }
  return t;
}

std::vector<EvalPoint> evalsFrom(const at::Tensor& t) {
  AIACC_CHECK_INPUT(t.dim() == 2 && t.size(1) == 7, "evaluation history of shape ", t.sizes());
  const at::Tensor c = t.to(at::kCPU, at::kDouble).contiguous();
  const double* v = c.data_ptr<double>();
  // A count is a whole number from 0 to 2^53 (a double holds every integer up to there), checked
  // before it becomes an int64 (a cast of anything else is undefined).
  auto count = [](double x, const char* what) {
    AIACC_CHECK_INPUT(x >= 0 && x <= 9007199254740992.0 && x == std::floor(x), "evaluation history: ", what, " ", x,
                      " is not a count");
    return static_cast<int64_t>(x);
  };
  std::vector<EvalPoint> out(static_cast<size_t>(c.size(0)));
  for (EvalPoint& e : out) {
    e.step = count(v[0], "step");
    e.epoch = v[1];
    e.seconds = v[2];
    e.top1 = v[3];
    e.top5 = v[4];
    e.loss = v[5];
    e.images = count(v[6], "images");
    v += 7;
  }
  return out;
}

TrainingState decodeArchiveCheckpoint(const std::string& bytes, const std::string& name, torch::nn::Module& model,
                                      torch::optim::SGD& optimizer) {
  TrainingState pos;
  try {
    torch::serialize::InputArchive root, state_ar, optim_ar;
    // Onto the model's device: a GPU run's checkpoint resumes on the CPU and the other way round.
    const auto params = model.parameters();
    root.load_from(bytes.data(), bytes.size(),
                   params.empty() ? c10::optional<torch::Device>() : params.front().device());
    c10::IValue v;
    root.read("format_version", v);
    const int64_t format = v.toInt();
    AIACC_CHECK_INPUT(format >= 2 && format <= 4, "format version ", format, " in a LibTorch archive, expected 2 to 4");
    // Model state by name, every shape checked: a checkpoint of another model is an error, not a
    // partial load (LibTorch's Module::load would silently replace mismatched tensors).
    root.read("state_count", v);
    models::NamedTensors state = models::stateOf(model);
    AIACC_CHECK_INPUT(v.toInt() == static_cast<int64_t>(state.size()), "it holds ", v.toInt(),
                      " tensors, the model has ", state.size());
    root.read("state", state_ar);
    models::NamedTensors loaded;
    for (auto& [key, dst] : state) {
      at::Tensor t;
      state_ar.read(key, t, /*is_buffer=*/true);
      loaded.emplace_back(key, t);
    }
    models::loadStateInto(model, loaded);
    root.read("optimizer", optim_ar);
    if (format >= 3) {
      readSgdState(optimizer, optim_ar);
    } else {
      readLegacySgdState(optimizer, optim_ar);
    }
    root.read("epochs_done", v);
    pos.epochs_done = v.toInt();
    root.read("step", v);
    pos.step = v.toInt();
    root.read("images_seen", v);
    pos.images_seen = v.toInt();
    root.read("elapsed_s", v);
    pos.elapsed_s = v.toDouble();
    root.read("train_s", v);
    pos.train_s = v.toDouble();
    if (root.try_read("loss_scale", v)) pos.loss_scale = v.toDouble();  // absent before AMP existed
    if (root.try_read("loss_scale_good_steps", v)) pos.loss_scale_good_steps = v.toInt();
    if (format >= 4) {
      root.read("batches_in_epoch", v);
      pos.batches_in_epoch = v.toInt();
      root.read("skipped_steps", v);
      pos.skipped_steps = v.toInt();
      root.read("checkpoint_failures", v);
      pos.checkpoint_failures = static_cast<int>(v.toInt());
      at::Tensor evals;
      root.read("evals", evals, /*is_buffer=*/true);
      pos.evals = evalsFrom(evals);
      root.read("target_reached", v);
      pos.target_reached = v.toBool();
      root.read("time_to_target_s", v);
      pos.time_to_target_s = v.toDouble();
      root.read("settings", v);
      pos.settings = settingsFrom(v.toStringRef());
      at::Tensor rng;
      if (root.try_read("rng_cpu", rng, /*is_buffer=*/true)) pos.rng_cpu = rng.cpu();
      root.read("rank_local_buffers", v);
      pos.rank_local_buffers = v.toBool();
    }
  } catch (const std::exception& e) {
    AIACC_THROW(IoError, "cannot read checkpoint '", name,
                "' (corrupt, truncated, or from another "
                "model/optimizer): ",
                firstLine(e.what()));
  }
  return pos;
}

}  // namespace aiacc::app
