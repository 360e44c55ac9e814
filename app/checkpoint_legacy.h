// Checkpoints of formats 2 to 4: LibTorch archives (torch::serialize::OutputArchive, a
// TorchScript zip) that aiacc wrote before format 5 (torch.save's format, app/checkpoint.h).
// Still read, so that runs checkpointed by earlier versions resume.
//   4: format 3 plus the TrainingState's mid-epoch position, history, settings and RNG state;
//   3: the optimizer state by parameter position (app/optim_state.h), the same in every LibTorch;
//   2: torch::optim's own layout, keyed by tensor addresses as each version prints them.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "app/training_state.h"

namespace torch {
namespace nn {
class Module;
}
namespace optim {
class SGD;
}
}  // namespace torch

namespace aiacc::app {

// The evaluation history as formats 4 and 5 store it: one [n, 7] float64 tensor of step,
// epoch, seconds, top1, top5, loss, images. evalsFrom throws InputError on another shape.
at::Tensor evalsTensor(const std::vector<EvalPoint>& evals);
std::vector<EvalPoint> evalsFrom(const at::Tensor& t);

// Restores model and optimizer from a format 2-4 archive in `bytes` and returns the state;
// IoError naming `name` when it cannot be decoded or belongs to another model.
TrainingState decodeArchiveCheckpoint(const std::string& bytes, const std::string& name, torch::nn::Module& model,
                                      torch::optim::SGD& optimizer);

}  // namespace aiacc::app
