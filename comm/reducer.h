// Reducer: the gradient half of data parallelism (the place of c10d's Reducer). It owns the
// gradient hooks, the bucket plan and the buckets; a BucketCodec (comm/bucket_codec.h) says what
// a bucket sends, a Transport carries it.
//
//   - A post-hook on each parameter's gradient accumulator fires as backward produces the
//     gradient; the parameter is then ready. When every parameter of a bucket is ready, buckets
//     launch strictly in plan order (the same sequence on every rank, which every transport
//     needs), while backward goes on: overlap.
//   - finish() launches whatever is left (parameters without a gradient contribute zeros),
//     waits, and writes the averaged gradients back into .grad, so any optimizer works unchanged.
//   - A communication failure (a bucket's launch or wait throws) aborts both transports before
//     anything else is waited for: the buckets still queued or running on other channels then
//     fail at once instead of each waiting out its timeout, and finish() throws the first error
//     with nothing left in flight. A bucket that fails while backward goes on (a peer died) ends
//     backward at the next gradient hook with that error (the transports aborted first): the
//     step is lost anyway, and the rest of backward is not computed for nothing.
//   - The plan is a pure function of the parameter list (comm/bucket_plan.h); after the first
//     step it is rebuilt once from the order gradients arrived on rank 0, broadcast so that every
//     rank rebuilds identically. setBucketCap() replans with another fusion cap (the tuner).
//   - At construction every rank checks a fingerprint of the plan (names, shapes, dtypes, bucket
//     boundaries) against everyone else's with one allgather: a mismatch is a CommError naming
//     the rank and the first differing parameter. No rank coordinates the steps.
//   - detect_unused: which parameters got a gradient on any rank rides on the last bucket as one
//     flag per parameter (summed with the gradients: no collective of its own; with a comm hook,
//     one bitwise-or allreduce of their own); those that got none anywhere keep an undefined
//     .grad (the optimizer skips them).
//
// Two transports, which may be the same: `data` carries the buckets (a StripedTransport spreads
// them over channels; the Reducer does not know channels), `control` the small collectives
// (fingerprints, the arrival order, the unused flags when they cannot ride). Calls the codec,
// the transports and comm/bucket_plan.h.
#pragma once

#include <torch/nn/module.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "aiacc/comm/bucket_codec.h"
#include "aiacc/comm/bucket_plan.h"
#include "aiacc/comm/comm_hook.h"
#include "aiacc/comm/gradient_sync.h"
#include "aiacc/comm/options.h"
#include "aiacc/comm/timeline.h"
#include "aiacc/comm/transport.h"

namespace torch::autograd {
struct Node;
}

namespace aiacc::comm {

class Reducer {
 public:
  // Installs the hooks and verifies the plan across ranks (a collective over `control`).
  // `timeline`: "bucket ready" instants (rank 0); `clock`: seconds on a monotonic clock, for the
  // exposed wait (empty: steady_clock; tests inject one).
  Reducer(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<Transport> data,
          std::shared_ptr<Transport> control, std::shared_ptr<BucketCodec> codec, const WorldInfo& world,
          const ReducerOptions& options, std::shared_ptr<Timeline> timeline = nullptr,
          std::function<double()> clock = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // While off, backward only accumulates into .grad locally (no communication); the first
  // backward with it on reduces the accumulated sum (gradient accumulation, DDP's no_sync).
  void setSync(bool on) { sync_ = on; }
  // Called at each gradient hook, before anything else, on autograd's thread (DataParallel's
  // finish in backward queues its end-of-backward callback from the first). Set before backward.
  void setOnGradient(std::function<void()> fn) { on_gradient_ = std::move(fn); }
  bool syncing() const { return sync_; }

  // After backward: see above. `agreed` (launch_in_backward off): one byte per parameter, 0 for
  // those that got a gradient on no rank. Returns false when the codec found a non-finite
  // reduced gradient, or a comm hook's finish() said to skip: every rank skips the step, and .grad
  // is unspecified.
  bool finish(const at::Tensor& agreed = at::Tensor());
  // The first half of finish(): launches the buckets not launched yet (launch_in_backward), so
  // that a caller can queue more behind them (DataParallel's stop vote) before finish() waits.
  // On a launch failure: the transports aborted, the step reset, the error thrown.
  void launchRemaining();
  // Seconds finish() waited for communication: the last call's, and the sum since construction.
  double lastExposedSeconds() const { return last_exposed_s_; }
  // Steps a comm hook said to skip (finish() returned false through it).
  int64_t hookSkippedSteps() const { return hook_skipped_; }
  double exposedSeconds() const { return exposed_s_; }

  // Between steps, on every rank alike (the tuner).
  void setBucketCap(double mb);
  void setTransports(std::shared_ptr<Transport> data, std::shared_ptr<Transport> control);

  const BucketPlan& plan() const { return plan_; }
  const std::vector<ParamInfo>& params() const { return infos_; }
  // The agreed arrival order the plan was rebuilt from after the first step (empty before), and
  // its restoration (a checkpoint's, CommState): the plan is rebuilt from it now, and not again
  // after the first step. On every rank alike, between steps. InputError unless a permutation of
  // the parameters.
  std::vector<int64_t> rebuiltOrder() const;
  void restoreOrder(const std::vector<int64_t>& order);
  double bucketCap() const { return opt_.bucket_mb; }
  // This rank's "had a gradient" flags, one byte per parameter (the central coordinator's input).
  at::Tensor localGradientFlags() const;

 private:
  void buildBuckets();
  void verifyFingerprints();
  void onGradReady(size_t param);  // autograd thread
  void stopIfStepFailed();         // (under mu_)
  void launch(size_t bucket);
  // Waits for every launched bucket (host: Work::synchronize()), and clears them. On a failure
  // the transports are aborted before the rest is waited for, then the first error is rethrown.
  void waitAll(bool host);
  void abortTransports(const std::string& why);
  void fill(size_t bucket);
  void checkDense(size_t param, const at::Tensor& grad) const;
  void fillDirect(size_t bucket);
  bool decodeInto(size_t param);
  bool finishHook();
  void rebuildFromArrivalOrder();
  void resetStep();

  std::shared_ptr<Transport> data_;
  std::shared_ptr<Transport> control_;
  std::shared_ptr<BucketCodec> codec_;
  WorldInfo world_;
  ReducerOptions opt_;
  std::shared_ptr<Timeline> timeline_;
  std::function<double()> clock_;
  std::vector<GradBucket> hooked_;  // opt_.hook: per bucket, what the hook sees

  std::vector<at::Tensor> params_;
  std::vector<ParamInfo> infos_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // keeps hooks alive
  std::vector<uintptr_t> hook_keys_;
  std::vector<size_t> order_;  // agreed gradient arrival order (bucket planning)
  bool rebuilt_ = false;       // order_ is the agreed arrival order (rebuilt or restored)

  BucketPlan plan_;
  std::vector<at::Tensor> buffers_;    // one flat fp32 buffer per bucket (undefined when direct_)
  std::vector<at::Tensor> wire_;       // per bucket: what travels (the buffer itself for fp32)
  std::vector<int64_t> bucket_numel_;  // per bucket: elements (gradients, then any flags)
  bool direct_ = false;                // gradients convert straight to/from wire_ (codec)
  std::vector<size_t> bucket_of_;      // param -> bucket
  std::vector<int64_t> offset_of_;     // param -> offset in its bucket
  int64_t flags_at_ = -1;              // detect_unused: offset of the flags in the last bucket

  // Per-step state, touched by the autograd thread (hooks) and the training thread.
  mutable std::mutex mu_;
  std::vector<int> pending_;    // per bucket: parameters still without gradient
  std::vector<char> ready_;     // per param
  std::vector<char> had_grad_;  // per param: a local gradient existed at launch
  size_t next_launch_ = 0;
  std::vector<std::shared_ptr<Work>> works_;
  std::vector<size_t> arrival_;  // first step: order gradients arrived
  int64_t steps_ = 0;
  std::atomic<bool> sync_{true};
  std::function<void()> on_gradient_;
  double last_exposed_s_ = 0;
  int64_t hook_skipped_ = 0;
  int64_t plan_generation_ = 0;  // buildBuckets() calls so far (GradBucket::plan)
  double exposed_s_ = 0;
};

}  // namespace aiacc::comm
