// Checkpoints: model parameters and buffers, optimizer state, and the TrainingState
// (app/training_state.h: position in the epoch, scales, history, settings, RNG, class names and
// the resolved configuration).
//
// Format 5 is torch.save's zip format holding one plain dict, so that Python reads it with
// torch.load(PATH, weights_only=True) under torch 1.13 and 2.x (models/torch_values.h: numbers
// with a fraction are 0-dim float64 tensors):
//   "format": "aiacc checkpoint", "format_version": 5,
//   "model": {torchvision name: tensor}, in torchvision's order (load_state_dict takes it),
//   "optimizer": app/optim_state.h's sgdStateValue (by parameter position),
//   "training_state": {"epochs_done", "step", "images_seen", "elapsed_s", "train_s",
//       "loss_scale", "loss_scale_good_steps", "batches_in_epoch", "skipped_steps",
//       "checkpoint_failures", "evals" ([n, 7] float64: step, epoch, seconds, top1, top5, loss,
//       images), "target_reached", "time_to_target_s", "settings" {name: value}, "rng_cpu"
//       (uint8 tensor or None), "rank_local_buffers", "epoch_train", "epoch_loss_sum",
//       "epoch_images", "epoch_lr", "transfer_scale", "transfer_scale_good_steps" (fp16
//       transfer's own scale; 0: none), "comm_tuned" (the tuner's frozen choice: {"bucket_mb",
//       "channels", "two_level"}, or None), "channel_weights" (float64 [active channels], empty
//       when buckets are not split), "bucket_order" (int64 [parameters], empty before the
//       first step rebuilt it), "rng_cuda" (rank 0's CUDA generator state, uint8, or None on
//       the CPU), "segment_offset", "segment_batch" (where an elastic job's current world
//       began within the epoch; 0 and 0 otherwise), "generation" (its membership generation; -1:
//       not elastic)},
//   "classes": [class name, ...], "config": {flag: value}.
// The optimizer state is kept by parameter position, so a checkpoint moves between LibTorch
// versions. Formats 2 to 4, LibTorch archives that no release wrote, are no longer read: their
// reader was LibTorch's TorchScript unpickler, which is not hardened against crafted files;
// decodeCheckpoint refuses them with one line. Every value is read by aiacc's own bounded
// reader (models/torch_unpickler.h); counts are range-checked before they are narrowed.
//
// encodeCheckpoint serializes into memory (the snapshot, taken on the training thread: the bytes
// can then be written anywhere, on any thread); saveCheckpoint writes them atomically
// (common/atomic_file.h), so a crash or a full disk mid-write leaves the previous file intact. A
// checkpoint that cannot be read raises IoError naming it; nothing falls back to a silent fresh
// start.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
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

// The evaluation history as checkpoints store it: one [n, 7] float64 tensor of step, epoch,
// seconds, top1, top5, loss, images. evalsFrom throws InputError on another shape, or a step or
// image count that is not a whole number from 0 to 2^53.
at::Tensor evalsTensor(const std::vector<EvalPoint>& evals);
std::vector<EvalPoint> evalsFrom(const at::Tensor& t);

std::string encodeCheckpoint(torch::nn::Module& model, torch::optim::SGD& optimizer, const TrainingState& state);

// Restores model and optimizer from `bytes` (onto the model's device) and returns the state.
// `name` (a path) is what errors name.
TrainingState decodeCheckpoint(const std::string& bytes, const std::string& name, torch::nn::Module& model,
                               torch::optim::SGD& optimizer);

// The training state alone (no model, no optimizer), as an elastic job's rank 0 sends it to
// survivors that already hold its model and optimizer state: a torch.save dict {"format": "aiacc
// training state", "format_version", "training_state", "classes", "config"}, laid out as in a
// checkpoint. decodeTrainingState throws IoError naming `name` on anything else.
std::string encodeTrainingState(const TrainingState& state);
TrainingState decodeTrainingState(const std::string& bytes, const std::string& name);

void saveCheckpoint(const std::string& path, torch::nn::Module& model, torch::optim::SGD& optimizer,
                    const TrainingState& state);

// InputError when `path` does not exist; IoError when it cannot be read or decoded.
TrainingState loadCheckpoint(const std::string& path, torch::nn::Module& model, torch::optim::SGD& optimizer);

}  // namespace aiacc::app
