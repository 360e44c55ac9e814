// The example's own gradient compression, plugged into DataParallel as a comm hook
// (aiacc/comm/comm_hook.h; PyTorch DDP's fp16_compress_hook): each bucket travels as fp16, half
// the bytes, divided by the world size before the sum so that it cannot overflow, and comes back
// as fp32.
#pragma once

#include <memory>
#include <string>

#include "aiacc/comm/comm_hook.h"

class Fp16Compress : public aiacc::comm::CommHook {
 public:
  std::shared_ptr<aiacc::comm::Work> launch(aiacc::comm::GradBucket& bucket, aiacc::comm::Transport& t) override {
    bucket.state = bucket.buffer.div(bucket.world).to(at::kHalf);  // what travels
    return t.allreduce(bucket.state);
  }
  bool finish(aiacc::comm::GradBucket& bucket) override {
    bucket.buffer.copy_(bucket.state);  // the average, back to fp32
    return bucket.buffer.isfinite().all().item<bool>();  // an overflow: every rank skips the step
  }
  std::string name() const override { return "fp16-compress"; }
};
