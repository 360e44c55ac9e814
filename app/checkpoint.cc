#include "app/checkpoint.h"

#include <torch/nn/module.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <filesystem>

#include "app/optim_state.h"
#include "common/atomic_file.h"
#include "common/error.h"
#include "models/weights.h"

namespace aiacc::app {
namespace {
// 3: optimizer state by parameter position (app/optim_state.h), the same in every LibTorch.
// 2: torch::optim's own layout, keyed by tensor addresses as each version prints them; still read.
constexpr int64_t kFormatVersion = 3;
constexpr int64_t kLegacyFormatVersion = 2;

std::string firstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace

void saveCheckpoint(const std::string& path, torch::nn::Module& model, torch::optim::SGD& optimizer,
                    const TrainPosition& pos) {
  // Serialize into memory first (LibTorch's file writer reports I/O errors from a destructor,
  // which would abort the process on a full disk), then write the bytes atomically.
  std::string bytes;
  {
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
    root.save_to([&bytes](const void* buf, size_t n) {
      bytes.append(static_cast<const char*>(buf), n);
      return n;
    });
  }
  try {
    writeFileAtomic(path, bytes);  // plain POSIX writes: a full disk shows up at write or fsync
  } catch (const IoError& e) {
    AIACC_THROW(IoError, "cannot save checkpoint (", bytes.size() >> 20, " MiB): ", e.what());
  }
}

TrainPosition loadCheckpoint(const std::string& path, torch::nn::Module& model, torch::optim::SGD& optimizer) {
  std::error_code ec;
  AIACC_CHECK_INPUT(std::filesystem::is_regular_file(path, ec), "--resume checkpoint '", path, "' does not exist");
  TrainPosition pos;
  try {
    torch::serialize::InputArchive root, state_ar, optim_ar;
    // Onto the model's device: a GPU run's checkpoint resumes on the CPU and the other way round.
    const auto params = model.parameters();
    root.load_from(path, params.empty() ? c10::optional<torch::Device>() : params.front().device());
    c10::IValue v;
    root.read("format_version", v);
    const int64_t format = v.toInt();
    AIACC_CHECK_INPUT(format == kFormatVersion || format == kLegacyFormatVersion, "format version ", format,
                      ", expected ", kLegacyFormatVersion, " or ", kFormatVersion);
    // Model state by name, every shape checked: a checkpoint of another model is an error, not a
    // partial load (LibTorch's Module::load would silently replace mismatched tensors).
    root.read("state_count", v);
    models::NamedTensors state = models::stateOf(model);
    AIACC_CHECK_INPUT(v.toInt() == static_cast<int64_t>(state.size()), "it holds ", v.toInt(),
                      " tensors, the model has ", state.size());
    root.read("state", state_ar);
    models::NamedTensors loaded;
    for (auto& [name, dst] : state) {
      at::Tensor t;
      state_ar.read(name, t, /*is_buffer=*/true);
      loaded.emplace_back(name, t);
    }
    models::loadStateInto(model, loaded);
    root.read("optimizer", optim_ar);
    if (format == kFormatVersion) {
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
  } catch (const std::exception& e) {
    AIACC_THROW(IoError, "cannot read checkpoint '", path,
                "' (corrupt, truncated, or from another "
                "model/optimizer): ",
                firstLine(e.what()));
  }
  return pos;
}

}  // namespace aiacc::app
