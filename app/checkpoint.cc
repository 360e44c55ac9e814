#include "app/checkpoint.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/nn/module.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "app/optim_state.h"
#include "aiacc/common/atomic_file.h"
#include "aiacc/common/error.h"
#include "models/torch_format.h"
#include "models/torch_unpickler.h"
#include "models/torch_values.h"
#include "models/weights.h"

namespace aiacc::app {
namespace {

constexpr int64_t kFormatVersion = 5;
constexpr const char* kFormatName = "aiacc checkpoint";
constexpr const char* kStateFormatName = "aiacc training state";  // encodeTrainingState's

using models::field;
using models::plainDict;
using models::plainList;
using models::real;

c10::impl::GenericDict pairsDict(const std::vector<std::pair<std::string, std::string>>& pairs) {
  c10::impl::GenericDict d = plainDict();
  for (const auto& [k, v] : pairs) d.insert_or_assign(k, v);
  return d;
}

std::vector<std::pair<std::string, std::string>> pairsFrom(const c10::IValue& v, const std::string& what) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& kv : models::dictOf(v, what)) {
    AIACC_CHECK_IO(kv.key().isString() && kv.value().isString(), what, " holds a value that is not a string");
    out.emplace_back(kv.key().toStringRef(), kv.value().toStringRef());
  }
  return out;
}

c10::impl::GenericDict stateDict(const TrainingState& p) {
  c10::impl::GenericDict d = plainDict();
  d.insert("epochs_done", p.epochs_done);
  d.insert("step", p.step);
  d.insert("images_seen", p.images_seen);
  d.insert("elapsed_s", real(p.elapsed_s));
  d.insert("train_s", real(p.train_s));
  d.insert("loss_scale", real(p.loss_scale));
  d.insert("loss_scale_good_steps", p.loss_scale_good_steps);
  d.insert("batches_in_epoch", p.batches_in_epoch);
  d.insert("skipped_steps", p.skipped_steps);
  d.insert("checkpoint_failures", static_cast<int64_t>(p.checkpoint_failures));
  d.insert("evals", evalsTensor(p.evals));
  d.insert("target_reached", p.target_reached);
  d.insert("time_to_target_s", real(p.time_to_target_s));
  d.insert("settings", pairsDict(p.settings));
  d.insert("rng_cpu", p.rng_cpu.defined() ? c10::IValue(p.rng_cpu.cpu()) : c10::IValue());
  d.insert("rank_local_buffers", p.rank_local_buffers);
  at::Tensor epochs = at::zeros({static_cast<int64_t>(p.epoch_train.size()), 3}, at::kDouble);
  for (size_t i = 0; i < p.epoch_train.size(); ++i) {
    const EpochTrain& e = p.epoch_train[i];
    epochs[static_cast<int64_t>(i)] = at::tensor({e.epoch, e.loss, e.lr}, at::kDouble);
  }
  d.insert("epoch_train", epochs);  // [epochs, 3]: epoch, train loss, last lr
  d.insert("epoch_loss_sum", real(p.epoch_loss_sum));
  d.insert("epoch_images", p.epoch_images);
  d.insert("epoch_lr", real(p.epoch_lr));
  d.insert("transfer_scale", real(p.comm.transfer_scale));
  d.insert("transfer_scale_good_steps", p.comm.transfer_good_steps);
  c10::IValue tuned;
  if (p.comm.tuned) {
    c10::impl::GenericDict t = plainDict();
    t.insert("bucket_mb", real(p.comm.tuned->bucket_mb));
    t.insert("channels", static_cast<int64_t>(p.comm.tuned->channels));
    t.insert("two_level", p.comm.tuned->two_level);
    tuned = t;
  }
  d.insert("comm_tuned", tuned);
  d.insert("channel_weights", at::tensor(p.comm.channel_weights, at::kDouble));
  d.insert("bucket_order", at::tensor(p.comm.bucket_order, at::kLong));
  d.insert("rng_cuda", p.rng_cuda.defined() ? c10::IValue(p.rng_cuda.cpu()) : c10::IValue());
  d.insert("segment_offset", p.segment_offset);
  d.insert("segment_batch", p.segment_batch);
  d.insert("generation", p.generation);
  d.insert("batch_world", p.batch_world);
  return d;
}

// A 1-D tensor's values (the channel shares, the bucket order).
template <typename T>
std::vector<T> vectorOf(const c10::IValue& v, const std::string& what) {
  AIACC_CHECK_IO(v.isTensor() && v.toTensor().dim() == 1, what, " is not a 1-D tensor");
  const at::Tensor t = v.toTensor().to(at::kCPU, c10::CppTypeToScalarType<T>::value).contiguous();
  return std::vector<T>(t.data_ptr<T>(), t.data_ptr<T>() + t.numel());
}

TrainingState stateFrom(const c10::impl::GenericDict& d) {
  const std::string w = "training_state";
  auto num = [&](const char* k) { return models::intOf(field(d, k, w), strCat(w, ".", k)); };
  auto realField = [&](const char* k) { return models::realOf(field(d, k, w), strCat(w, ".", k)); };
  TrainingState p;
  p.epochs_done = num("epochs_done");
  p.step = num("step");
  p.images_seen = num("images_seen");
  p.elapsed_s = realField("elapsed_s");
  p.train_s = realField("train_s");
  p.loss_scale = realField("loss_scale");
  p.loss_scale_good_steps = num("loss_scale_good_steps");
  p.batches_in_epoch = num("batches_in_epoch");
  p.skipped_steps = num("skipped_steps");
  p.checkpoint_failures = static_cast<int>(models::intIn(field(d, "checkpoint_failures", w), w + ".checkpoint_failures",
                                                         0, std::numeric_limits<int>::max()));
  const c10::IValue evals = field(d, "evals", w);
  AIACC_CHECK_IO(evals.isTensor(), "training_state.evals is not a tensor");
  p.evals = evalsFrom(evals.toTensor());
  p.target_reached = models::boolOf(field(d, "target_reached", w), "training_state.target_reached");
  p.time_to_target_s = realField("time_to_target_s");
  p.settings = pairsFrom(field(d, "settings", w), "training_state.settings");
  const c10::IValue rng = field(d, "rng_cpu", w);
  if (rng.isTensor()) p.rng_cpu = rng.toTensor().cpu();
  p.rank_local_buffers = models::boolOf(field(d, "rank_local_buffers", w), "training_state.rank_local_buffers");
  if (d.contains("epoch_train")) {  // written since the per-epoch records (summary.csv)
    const c10::IValue t = field(d, "epoch_train", w);
    AIACC_CHECK_IO(t.isTensor() && t.toTensor().dim() == 2 && t.toTensor().size(1) == 3,
                   "training_state.epoch_train is not an [epochs, 3] tensor");
    const at::Tensor e = t.toTensor().to(at::kCPU, at::kDouble).contiguous();
    for (int64_t i = 0; i < e.size(0); ++i) {
      p.epoch_train.push_back(EpochTrain{e[i][0].item<double>(), e[i][1].item<double>(), e[i][2].item<double>()});
    }
    p.epoch_loss_sum = realField("epoch_loss_sum");
    p.epoch_images = num("epoch_images");
    p.epoch_lr = realField("epoch_lr");
  }
  if (d.contains("transfer_scale")) {  // written since fp16 transfer's own scale is saved
    p.comm.transfer_scale = realField("transfer_scale");
    p.comm.transfer_good_steps = num("transfer_scale_good_steps");
  }
  if (d.contains("comm_tuned")) {  // written since the tuner's choice, shares and order are saved
    const c10::IValue tuned = field(d, "comm_tuned", w);
    if (!tuned.isNone()) {
      const c10::impl::GenericDict t = models::dictOf(tuned, "training_state.comm_tuned");
      const std::string tw = "training_state.comm_tuned";
      p.comm.tuned = comm::TuneConfig{
          models::realOf(field(t, "bucket_mb", tw), tw + ".bucket_mb"),
          static_cast<int>(models::intIn(field(t, "channels", tw), tw + ".channels", 1, 16)),
          models::boolOf(field(t, "two_level", tw), tw + ".two_level")};
    }
    p.comm.channel_weights = vectorOf<double>(field(d, "channel_weights", w), "training_state.channel_weights");
    p.comm.bucket_order = vectorOf<int64_t>(field(d, "bucket_order", w), "training_state.bucket_order");
  }
  if (d.contains("rng_cuda")) {  // written since a GPU run's CUDA generator is saved
    const c10::IValue cuda = field(d, "rng_cuda", w);
    if (cuda.isTensor()) p.rng_cuda = cuda.toTensor().cpu();
  }
  if (d.contains("segment_offset")) {  // written since elastic jobs re-shard an epoch
    p.segment_offset = num("segment_offset");
    p.segment_batch = num("segment_batch");
    p.generation = num("generation");
  }
  if (d.contains("batch_world")) p.batch_world = num("batch_world");  // written since --elastic-batch keep-global
  return p;
}

// The training state, class names and configuration of `root` (a checkpoint's, or encodeTrainingState's).
TrainingState positionFrom(const c10::impl::GenericDict& root) {
  TrainingState p = stateFrom(models::dictOf(field(root, "training_state", "the checkpoint"), "training_state"));
  for (const c10::IValue& c : models::listOf(field(root, "classes", "the checkpoint"), "classes")) {
    AIACC_CHECK_IO(c.isString(), "a class name that is not a string");
    p.classes.push_back(c.toStringRef());
  }
  p.config = pairsFrom(field(root, "config", "the checkpoint"), "config");
  return p;
}

// What the training state adds to a checkpoint's root: the state, class names and configuration.
void insertPosition(c10::impl::GenericDict& root, const TrainingState& pos) {
  c10::impl::GenericList classes = plainList();
  for (const std::string& c : pos.classes) classes.push_back(c);
  root.insert("training_state", stateDict(pos));
  root.insert("classes", classes);
  root.insert("config", pairsDict(pos.config));
}

// Format 5: torch.save's zip format holding one plain dict (see checkpoint.h).
TrainingState decodeTorchSaveCheckpoint(const std::string& bytes, const std::string& name, torch::nn::Module& model,
                                        torch::optim::SGD& optimizer) {
  const models::Unpickled file = models::readTorchSaveBytes(bytes, name);
  const c10::impl::GenericDict root = models::dictOf(file.value, "the checkpoint");
  const c10::IValue kind = field(root, "format", "the checkpoint");
  AIACC_CHECK_IO(kind.isString() && kind.toStringRef() == kFormatName, "not an aiacc checkpoint");
  const int64_t format = models::intOf(field(root, "format_version", "the checkpoint"), "format_version");
  AIACC_CHECK_IO(format == kFormatVersion, "format version ", format, ", this aiacc reads ", kFormatVersion);
  // Model state by name, every shape checked: a checkpoint of another model is an error, not a
  // partial load.
  models::NamedTensors loaded;
  for (const auto& kv : models::dictOf(field(root, "model", "the checkpoint"), "model")) {
    AIACC_CHECK_IO(kv.key().isString() && kv.value().isTensor(), "the model state holds a value that is not a tensor");
    loaded.emplace_back(kv.key().toStringRef(), kv.value().toTensor());
  }
  models::loadStateInto(model, loaded);
  restoreSgdState(optimizer, field(root, "optimizer", "the checkpoint"));
  return positionFrom(root);
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

std::string encodeCheckpoint(torch::nn::Module& model, torch::optim::SGD& optimizer, const TrainingState& pos) {
  c10::impl::GenericDict model_state = plainDict();
  for (const auto& [name, t] : models::stateDictOf(model)) model_state.insert(name, t);
  c10::impl::GenericDict root = plainDict();
  root.insert("format", kFormatName);
  root.insert("format_version", kFormatVersion);
  root.insert("model", model_state);
  root.insert("optimizer", sgdStateValue(optimizer));
  insertPosition(root, pos);
  return models::encodeTorchSave(c10::IValue(root));
}

std::string encodeTrainingState(const TrainingState& pos) {
  c10::impl::GenericDict root = plainDict();
  root.insert("format", kStateFormatName);
  root.insert("format_version", kFormatVersion);
  insertPosition(root, pos);
  return models::encodeTorchSave(c10::IValue(root));
}

TrainingState decodeTrainingState(const std::string& bytes, const std::string& name) {
  try {
    const models::Unpickled file = models::readTorchSaveBytes(bytes, name);
    const c10::impl::GenericDict root = models::dictOf(file.value, "the training state");
    const c10::IValue kind = field(root, "format", "the training state");
    AIACC_CHECK_IO(kind.isString() && kind.toStringRef() == kStateFormatName, "not an aiacc training state");
    const int64_t format = models::intOf(field(root, "format_version", "the training state"), "format_version");
    AIACC_CHECK_IO(format == kFormatVersion, "format version ", format, ", this aiacc reads ", kFormatVersion);
    return positionFrom(root);
  } catch (const std::exception& e) {
    AIACC_THROW(IoError, "cannot read ", name, ": ", firstLine(e.what()));
  }
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
  AIACC_CHECK_IO(!models::isTorchScriptArchive(bytes), "cannot read checkpoint '", name,
                 "': it is a LibTorch archive (checkpoint formats 2 to 4, which no release wrote), no longer read; "
                 "start afresh, or resume it with the aiacc that wrote it");
  try {
    return decodeTorchSaveCheckpoint(bytes, name, model, optimizer);
  } catch (const std::exception& e) {  // aiacc's errors, and LibTorch's on a value of an unexpected type
    AIACC_THROW(IoError, "cannot read checkpoint '", name,
                "' (corrupt, truncated, or from another model/optimizer): ", firstLine(e.what()));
  }
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
