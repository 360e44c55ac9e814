// A checkpoint and an elastic job's training state on any bytes (app/checkpoint.h), restored into
// a small module (a linear layer and a BatchNorm) and its SGD: every format still read. A bad
// file ends in a one-line IoError (--resume auto then falls back to the checkpoint before it),
// never a crash. With AIACC_FUZZ_WRITE_SEEDS=DIR set, the target first writes its seeds there:
// a checkpoint and a training state of that module, encoded by aiacc itself.
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "aiacc/common/error.h"
#include "app/checkpoint.h"
#include "fuzz/fuzz_util.h"

namespace {

struct Small : torch::nn::Module {
  Small() {
    register_module("fc", torch::nn::Linear(3, 2));
    register_module("bn", torch::nn::BatchNorm1d(2));
  }
};

struct Target {
  std::shared_ptr<Small> model = std::make_shared<Small>();
  torch::optim::SGD sgd{model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)};
};

aiacc::app::TrainingState sampleState() {
  aiacc::app::TrainingState s;
  s.epochs_done = 2;
  s.step = 40;
  s.images_seen = 1280;
  s.evals.push_back({20, 1.0, 3.5, 0.25, 0.5, 2.0, 640});
  s.settings = {{"world size", "2"}, {"steps per epoch", "20"}};
  s.classes = {"cat", "dog"};
  s.config = {{"lr", "0.1"}, {"batch_size", "32"}};
  s.epoch_train.push_back({1.0, 2.5, 0.1});
  s.comm.channel_weights = {0.5, 0.5};
  s.comm.bucket_order = {1, 0};
  return s;
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("AIACC_FUZZ_WRITE_SEEDS")) {
    Target t;
    // A step, so that the optimizer has momentum buffers to save.
    t.sgd.zero_grad();
    for (auto& p : t.model->parameters()) p.mutable_grad() = torch::ones_like(p);
    t.sgd.step();
    write(std::string(dir) + "/checkpoint", aiacc::app::encodeCheckpoint(*t.model, t.sgd, sampleState()));
    write(std::string(dir) + "/training_state", aiacc::app::encodeTrainingState(sampleState()));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Target t;  // afresh for each input, so that a finding reproduces from its input alone
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    aiacc::app::decodeCheckpoint(bytes, "fuzz.ckpt", *t.model, t.sgd);
  } catch (const aiacc::Error& e) {
    aiacc::fuzz::checkOneLine(e.what());
  }
  try {
    aiacc::app::decodeTrainingState(bytes, "fuzz.state");
  } catch (const aiacc::Error& e) {
    aiacc::fuzz::checkOneLine(e.what());
  }
  return 0;
}
