#include "app/checkpoint.h"

#include <torch/nn/module.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "app/optim_state.h"
#include "common/atomic_file.h"
#include "common/error.h"
#include "models/weights.h"

namespace aiacc::app {
namespace {
// 4: format 3 plus the TrainingState's mid-epoch position, history, settings and RNG state.
// 3: optimizer state by parameter position (app/optim_state.h), the same in every LibTorch.
// 2: torch::optim's own layout, keyed by tensor addresses as each version prints them; still read.
constexpr int64_t kFormatVersion = 4;
constexpr int64_t kLegacyFormatVersion = 2;

std::string firstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// The evaluations as one [n, 7] double tensor: step, epoch, seconds, top1, top5, loss, images.
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
  std::vector<EvalPoint> out(static_cast<size_t>(c.size(0)));
  for (EvalPoint& e : out) {
    e.step = static_cast<int64_t>(v[0]);
    e.epoch = v[1];
    e.seconds = v[2];
    e.top1 = v[3];
    e.top5 = v[4];
    e.loss = v[5];
    e.images = static_cast<int64_t>(v[6]);
    v += 7;
  }
  return out;
}

// Settings as "name\tvalue\n" lines (names and values hold neither).
std::string settingsText(const std::vector<std::pair<std::string, std::string>>& settings) {
  std::string out;
  for (const auto& [k, v] : settings) out += k + "\t" + v + "\n";
  return out;
}

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

std::string encodeCheckpoint(torch::nn::Module& model, torch::optim::SGD& optimizer, const TrainingState& pos) {
  // Into memory (LibTorch's file writer reports I/O errors from a destructor, which would abort
  // the process on a full disk); the caller writes the bytes.
  std::string bytes;
  torch::serialize::OutputArchive root, state_ar, optim_ar;
  const models::NamedTensors state = models::stateOf(model);
  for (const auto& [name, t] : state) state_ar.write(name, t.detach().cpu(), /*is_buffer=*/true);
  writeSgdState(optimizer, optim_ar);
  root.write("state", state_ar);
  root.write("optimizer", optim_ar);
  root.write("format_version", c10::IValue(kFormatVersion));
  root.write("state_count", c10::IValue(static_cast<int64_t>(state.size())));
  root.write("epochs_done", c10::IValue(pos.epochs_done));
  root.write("step", c10::IValue(pos.step));
  root.write("images_seen", c10::IValue(pos.images_seen));
  root.write("elapsed_s", c10::IValue(pos.elapsed_s));
  root.write("train_s", c10::IValue(pos.train_s));
  root.write("loss_scale", c10::IValue(pos.loss_scale));
  root.write("loss_scale_good_steps", c10::IValue(pos.loss_scale_good_steps));
  root.write("batches_in_epoch", c10::IValue(pos.batches_in_epoch));
  root.write("skipped_steps", c10::IValue(pos.skipped_steps));
  root.write("checkpoint_failures", c10::IValue(static_cast<int64_t>(pos.checkpoint_failures)));
  root.write("evals", evalsTensor(pos.evals), /*is_buffer=*/true);
  root.write("target_reached", c10::IValue(pos.target_reached));
  root.write("time_to_target_s", c10::IValue(pos.time_to_target_s));
  root.write("settings", c10::IValue(settingsText(pos.settings)));
  if (pos.rng_cpu.defined()) root.write("rng_cpu", pos.rng_cpu.cpu(), /*is_buffer=*/true);
  root.write("rank_local_buffers", c10::IValue(pos.rank_local_buffers));
  root.save_to([&bytes](const void* buf, size_t n) {
    bytes.append(static_cast<const char*>(buf), n);
    return n;
  });
  return bytes;
}

void saveCheckpoint(const std::string& path, torch::nn::Module& model, torch::optim::SGD& optimizer,
                    const TrainingState& state) {
  const std::string bytes = encodeCheckpoint(model, optimizer, state);
  try {
    writeFileAtomic(path, bytes);  // plain POSIX writes: a full disk shows up at write or fsync
  } catch (const IoError& e) {
    AIACC_THROW(IoError, "cannot save checkpoint (", bytes.size() >> 20, " MiB): ", e.what());
  }
}

TrainingState decodeCheckpoint(const std::string& bytes, const std::string& name, torch::nn::Module& model,
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
    AIACC_CHECK_INPUT(format >= kLegacyFormatVersion && format <= kFormatVersion, "format version ", format,
                      ", expected ", kLegacyFormatVersion, " to ", kFormatVersion);
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

TrainingState loadCheckpoint(const std::string& path, torch::nn::Module& model, torch::optim::SGD& optimizer) {
  std::error_code ec;
  AIACC_CHECK_INPUT(std::filesystem::is_regular_file(path, ec), "--resume checkpoint '", path, "' does not exist");
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) AIACC_THROW(IoError, "cannot read checkpoint '", path, "'");
  return decodeCheckpoint(bytes, path, model, optimizer);
}

}  // namespace aiacc::app
