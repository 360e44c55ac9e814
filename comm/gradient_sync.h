// The seam between the training loop and data parallelism.
//
// The trainer talks only to GradientSync: it runs forward and backward on its own batch, then
// calls finishBackward(), after which every parameter's .grad holds the gradient averaged over
// all ranks (so any optimizer works unchanged), and sums its evaluation counts with
// allreduceSum(). LocalSync is the single-process case (world size 1), where both are exact
// no-ops; aiacc::comm::DataParallel (the comm issue) implements the same interface over
// Gloo/NCCL with bucketing and backward overlap.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "aiacc/config.h"  // the build's options, and its refusal of the other C++ ABI
#include "aiacc/comm/grad_scale.h"
#include "aiacc/comm/options.h"
#include "aiacc/common/error.h"

namespace aiacc::comm {

// The part of a data-parallel set-up's state that a checkpoint carries so that a resumed run
// continues as the uninterrupted one. Every rank holds the same values.
//   - fp16 transfer's own gradient scale (transfer_scale 0: none, as with fp32 or bf16 transfer,
//     or when the AMP loss scale is shared, whose owner saves it) and its clean steps since it
//     last moved: they decide every later step's rounding and skips;
//   - the tuner's frozen choice (none while it is still tuning: a set-up restored from that tunes
//     again from the start): a restored set-up applies it and does not tune, so the steps after a
//     resume neither pay for trials again nor sum in other bucket and channel layouts;
//   - striping's channel shares (a split bucket's piece boundaries, hence, with 3 or more ranks,
//     each element's summation order), a moving average of measured speeds;
//   - the agreed gradient arrival order the buckets were rebuilt from after the first step
//     (empty: not rebuilt yet), which decides what each bucket holds.
struct CommState {
  double transfer_scale = 0;
  int64_t transfer_good_steps = 0;
  std::optional<TuneConfig> tuned;
  std::vector<double> channel_weights;
  std::vector<int64_t> bucket_order;  // parameter indices, in the order buckets are packed
};

// InputError for a state no set-up could have written (see GradientSync::restoreCommState);
// `params` > 0: the bucket order must be a permutation of that many parameters.
void checkCommState(const CommState& state, size_t params);

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  virtual const WorldInfo& world() const = 0;
  // Called before each training forward (DataParallel: BN buffers, per its BufferSync).
  virtual void beforeForward() {}
  // Called by every rank before the model's buffers are read (evaluation, checkpoint, the end of
  // training): makes them agree across ranks. A collective: all ranks call it at the same point.
  virtual void syncBuffers() {}
  // Called after loss.backward(). Returns false when every rank must skip this optimizer step
  // (e.g. a non-finite reduced gradient); the gradients are then undefined.
  virtual bool finishBackward() = 0;
  // In-place sum of a small CPU tensor over all ranks (metrics, counts).
  virtual void allreduceSum(at::Tensor& t) = 0;
  // Blocks until the communication finishBackward() started is done on the device too, and
  // raises its error: call it before the host reads what the reduced gradients produced (a
  // loss, an overflow check, the parameters). Over NCCL finishBackward() only orders the
  // streams, and a failed reduction would otherwise be raised only by the next collective,
  // after the host read values computed from it. Nothing to do where finishBackward() blocks.
  virtual void synchronize() {}
  // Seconds spent waiting for gradient communication after backward ended, since construction.
  virtual double exposedCommSeconds() const = 0;
  // The communication set-up in one line (empty for a single process).
  virtual std::string describe() const { return ""; }
  // True while the communication set-up is still being tuned (steps not representative).
  virtual bool tuning() const { return false; }
  // Mixed precision: from now on the gradients reaching finishBackward() are multiplied by
  // `scale` (the loss scale). Returns true when this sync divides them by it after the reduce,
  // checks them and moves the scale (skipping the step on overflow), so the caller must not;
  // false (the default) when the caller unscales after finishBackward() as usual.
  virtual bool shareLossScale(std::shared_ptr<GradScale>) { return false; }
  // The state to checkpoint (CommState), and its restoration: call restoreCommState() on every
  // rank with the same state, after shareLossScale(), before the first step. Returns one line for
  // each part of the state this set-up has no use for, and ignores that part (empty: all of it
  // was applied): a transfer scale where this set-up's transfer has no scale of its own (the
  // transfer dtype may change across a resume), a tuner's choice where this one does not tune or
  // cannot run it (more channels than its transport has, two-level reduction without it), channel
  // shares for another channel count. A part the state lacks leaves this set-up's own (its
  // initial scale, its tuning, equal shares, the order the first step finds). InputError for a
  // state no set-up could have written: a scale that is not positive and finite, shares that are
  // not, a bucket order that is not a permutation of the parameters.
  virtual CommState commState() const { return {}; }
  virtual std::vector<std::string> restoreCommState(const CommState& state);
  // Rank `root`'s `t` into every rank's `t` (same shape and dtype everywhere; any dtype: bytes
  // are copied). An elastic job hands a survivor's training state to the others with it. This
  // default serves a world of one (nothing to send) and refuses more.
  virtual void broadcast(at::Tensor& t, int root);
  // Flags every rank must act on at the same step (aiacc_train: bit 0 "stop: a signal came",
  // bit 1 "checkpoint now: rank 0's clock says it is time"), agreed without a blocking
  // collective per step. `mine`: this rank's flags. Returns the OR over the ranks of the flags
  // of one call: the same value on every rank at the same call. A collective: every rank calls
  // it the same number of times, at the same points (once per training step).
  // This default answers this call's flags with one blocking sum through allreduceSum (alone:
  // `mine` itself). DataParallel answers with the previous call's instead (0 at the first call):
  // one byte sent right behind the next step's last gradient bucket (every rank meets it there,
  // in step; by the next call itself if no step came between) and read at the next call, so no
  // collective blocks a step, and a flag raised on any rank reaches every rank at most 2 calls
  // later.
  virtual uint8_t voteFlags(uint8_t mine) {
    at::Tensor bits = at::zeros({8}, at::kDouble);
    for (int b = 0; b < 8; ++b) bits[b] = (mine >> b) & 1;
    allreduceSum(bits);
    uint8_t out = 0;
    for (int b = 0; b < 8; ++b) out |= static_cast<uint8_t>((bits[b].item<double>() > 0 ? 1 : 0) << b);
    return out;
  }
};

// World size 1: gradients are already the average over the (one) rank's batch.
class LocalSync : public GradientSync {
 public:
  const WorldInfo& world() const override { return info_; }
  bool finishBackward() override { return true; }
  void allreduceSum(at::Tensor&) override {}
  double exposedCommSeconds() const override { return 0.0; }

 private:
  WorldInfo info_;
};

}  // namespace aiacc::comm
