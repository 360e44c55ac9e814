#include "app/checkpoint.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>

#include <filesystem>

#include "common/error.h"

namespace aiacc::app {
namespace {
constexpr int64_t kFormatVersion = 1;
}

void saveCheckpoint(const std::string& path, torch::nn::Module& model,
                    torch::optim::Optimizer& optimizer, const TrainPosition& pos) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    torch::serialize::OutputArchive root, model_ar, optim_ar;
    model.save(model_ar);
    optimizer.save(optim_ar);
    root.write("model", model_ar);
    root.write("optimizer", optim_ar);
    root.write("format_version", c10::IValue(kFormatVersion));
    root.write("epochs_done", c10::IValue(pos.epochs_done));
    root.write("step", c10::IValue(pos.step));
    root.write("images_seen", c10::IValue(pos.images_seen));
    root.write("elapsed_s", c10::IValue(pos.elapsed_s));
    root.write("train_s", c10::IValue(pos.train_s));
    root.save_to(tmp);
  } catch (const std::exception& e) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    AIACC_THROW(IoError, "cannot write checkpoint '", path, "' (disk full?): ", what);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    AIACC_THROW(IoError, "cannot move checkpoint into '", path, "': ", ec.message());
  }
}

TrainPosition loadCheckpoint(const std::string& path, torch::nn::Module& model,
                             torch::optim::Optimizer& optimizer) {
  std::error_code ec;
  AIACC_CHECK_INPUT(std::filesystem::is_regular_file(path, ec), "--resume checkpoint '", path,
                    "' does not exist");
  TrainPosition pos;
  try {
    torch::serialize::InputArchive root, model_ar, optim_ar;
    root.load_from(path);
    c10::IValue v;
    root.read("format_version", v);
    AIACC_CHECK_INPUT(v.toInt() == kFormatVersion, "format version ", v.toInt());
    root.read("model", model_ar);
    model.load(model_ar);
    root.read("optimizer", optim_ar);
    optimizer.load(optim_ar);
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
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    AIACC_THROW(IoError, "cannot read checkpoint '", path, "' (corrupt, truncated, or from another "
                "model/optimizer): ", what);
  }
  return pos;
}

}  // namespace aiacc::app
