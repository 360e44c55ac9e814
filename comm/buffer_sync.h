// Module state across ranks: rank 0's parameters and buffers broadcast to every rank (at the
// start, so that all ranks begin from the same weights), and the policy for BatchNorm running
// statistics during training (BufferPolicy). Collectives over a Transport given per call (the
// tuner may switch DataParallel's transport between steps), on its channel 0; tensors of one
// dtype travel as one flat buffer. Calls only the Transport.
#pragma once

#include <torch/nn/module.h>

#include "aiacc/comm/options.h"
#include "aiacc/comm/transport.h"

namespace aiacc::comm {

// Rank 0's parameters and/or buffers to every rank, in place.
void broadcastModuleState(torch::nn::Module& module, Transport& transport, bool parameters, bool buffers);

class BufferPolicy {
 public:
  BufferPolicy(std::shared_ptr<torch::nn::Module> module, BufferSync mode, int world)
      : module_(std::move(module)), mode_(mode), world_(world) {}

  // Before each training forward: kBroadcast broadcasts, kAverage averages; the buffers are then
  // about to change.
  void beforeForward(Transport& transport);
  // Before the buffers are read: makes them agree, per the mode, unless no training forward ran
  // since they last agreed (values that already agree need no collective).
  void beforeRead(Transport& transport);
  // After a training step (DataParallel::finishBackward(), on every rank alike): a forward ran, so
  // the next beforeRead() makes the buffers agree even in a loop that never calls beforeForward().
  void markChanged() { dirty_ = true; }

 private:
  void average(Transport& transport);

  std::shared_ptr<torch::nn::Module> module_;
  BufferSync mode_;
  int world_;
  bool dirty_ = false;  // a training forward ran since the buffers last agreed
};

}  // namespace aiacc::comm
