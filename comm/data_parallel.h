// DataParallel: LibTorch's missing DistributedDataParallel. Wrapping a model takes two lines:
//
//   auto transport = std::make_shared<comm::GlooTransport>(store, gloo_options);
//   comm::DataParallel dp(model, transport, world_info);   // broadcasts rank 0's weights
//   ... dp.beforeForward(); loss = f(model(x)); loss.backward(); dp.finishBackward(); opt.step();
//
// How it works (see ../shared/docs/design.md):
//   - A post-hook on each parameter's gradient accumulator fires as backward produces the
//     gradient. The parameter's gradient is copied into its bucket; when a bucket is full, it is
//     averaged (divided by world size) and its allreduce is launched, strictly in plan order,
//     while backward goes on (overlap). finishBackward() launches whatever is left (parameters
//     without a gradient contribute zeros), waits, and writes averaged gradients back into .grad,
//     so any optimizer works unchanged.
//   - The bucket plan is a pure function of the parameter list (comm/bucket_plan.h); after the
//     first step it is rebuilt once from the order gradients actually arrived on rank 0,
//     broadcast so that every rank rebuilds identically.
//   - Decentralized negotiation: at construction every rank checks a fingerprint of the plan
//     (names, shapes, dtypes, bucket boundaries) against everyone else's with one allgather; a
//     mismatch is a CommError naming the rank and the first differing parameter. No rank
//     coordinates the steps.
#pragma once

#include <torch/nn/module.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/autotune.h"
#include "comm/bucket_plan.h"
#include "comm/gradient_sync.h"
#include "comm/timeline.h"
#include "comm/transport.h"

namespace torch::autograd {
struct Node;
}

namespace aiacc::comm {

// BN running statistics (floating-point buffers) across ranks. Training never reads them (train-
// mode BN normalizes with the batch's own statistics); evaluation and checkpoints do, after
// syncBuffers().
enum class BufferSync {
  kBroadcast,  // rank 0's, broadcast before each forward (DDP's default) and in syncBuffers()
  kAverage,    // every rank's averaged before each forward and in syncBuffers()
  // Every rank's averaged only in syncBuffers(), i.e. when they are about to be read: the same
  // values as kAverage (a running statistic is an exponential moving average, linear in its
  // updates, so the average of the ranks' averages is the average kAverage keeps), without a
  // collective, and the synchronisation point it forces, before every forward.
  kAverageWhenRead,
  kNone,  // each rank keeps its own
};

enum class Negotiation {
  kDecentralized,  // every rank launches buckets in plan order as they fill (default)
  kCentral,        // classic coordinator, for comparison: at the end of backward rank 0 gathers
                   // every rank's readiness and broadcasts what to reduce; nothing overlaps
};

enum class TransferDtype { kFloat32, kFloat16, kBFloat16 };

struct DataParallelOptions {
  double bucket_mb = 25;        // cap of a fused bucket
  double first_bucket_mb = 1;   // small first bucket: communication starts early in backward
  BufferSync buffers = BufferSync::kBroadcast;
  // Agree each step, with one bitwise-or allreduce of a bitmask, which parameters got a
  // gradient on any rank; those that got none anywhere keep an undefined .grad (the optimizer
  // skips them). Off: every parameter gets the averaged gradient (zeros where unused).
  bool detect_unused = false;
  Negotiation negotiation = Negotiation::kDecentralized;
  // Channels a bucket is split across (0: all of the transport's). Bytes go to each channel in
  // proportion to its measured throughput (a moving average of allreduced per-channel
  // measurements, so every rank splits identically); buckets below min_split_bytes go whole to
  // one channel, round robin.
  int channels = 0;
  bool balance_channels = true;
  double balance_alpha = 0.5;  // weight of the newest measurement in the moving average
  int64_t min_split_bytes = 256 * 1024;
  // fp16 transfer: a bucket is divided by world size and multiplied by the gradient scale, cast
  // to fp16, reduced (pairwise sums in fp32, F16C), cast back and unscaled. A non-finite value
  // after the reduce is seen identically by every rank: all skip the step (finishBackward returns
  // false) and halve the scale; after scale_growth_steps clean steps the scale doubles.
  // On CPU each gradient is converted straight into the fp16 wire buffer and the result straight
  // back into .grad (no fp32 bucket); so after a skipped step .grad holds the overflowed values,
  // which the optimizer must not apply (it never sees them: finishBackward returned false).
  // Gradients stay fp32 in the model. Under GPU mixed precision the loss scaler unscales the
  // gradients before they reach DataParallel, so the two scales never compound.
  // bf16 transfer: the same path without a gradient scale (bf16 has fp32's range; what it lacks
  // is mantissa, which scaling cannot give), still with the non-finite check and skip.
  TransferDtype transfer = TransferDtype::kFloat32;
  double grad_scale = 1024;
  int scale_growth_steps = 200;
  bool rebuild_after_first_step = true;
  int channel = 0;
  // Autotune: from the second step on, try fusion caps, channel counts and (when two_level is
  // given) two-level reduction, a few steps each, and freeze the fastest (comm/autotune.h).
  // Every rank averages its step times with one allreduce, so all decide alike.
  bool autotune = false;
  TuneSpace tune_space;
  // A second transport over the same ranks (two-level reduction) the tuner may switch to.
  std::shared_ptr<Transport> two_level;
  // Tuner decisions as instant events (rank 0).
  std::shared_ptr<Timeline> timeline;
};

class DataParallel : public GradientSync {
 public:
  DataParallel(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<Transport> transport,
               const WorldInfo& world, const DataParallelOptions& options = {});
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  const WorldInfo& world() const override { return world_; }
  void beforeForward() override;
  void syncBuffers() override;
  bool finishBackward() override;
  void allreduceSum(at::Tensor& t) override;
  double exposedCommSeconds() const override { return exposed_s_; }
  std::string describe() const override;
  bool tuning() const override { return tuner_ && !tuner_->frozen(); }
  const Autotuner* tuner() const { return tuner_.get(); }

  // Gradient accumulation: while sync is off, backward only accumulates into .grad locally
  // (no communication); the first backward with sync on reduces the accumulated sum.
  void setSync(bool on) { sync_ = on; }

  const BucketPlan& plan() const { return plan_; }
  // Current share of a split bucket per channel (sums to 1); identical on every rank.
  const std::vector<double>& channelWeights() const { return weights_; }
  double gradScale() const { return scale_; }
  int64_t skippedSteps() const { return skipped_; }
  const std::vector<ParamInfo>& params() const { return infos_; }

 private:
  void buildBuckets(const BucketPlan& plan);
  void verifyFingerprints();
  void broadcastState(bool parameters, bool buffers);
  void averageBuffers();
  void onGradReady(size_t param);  // autograd thread
  void launch(size_t bucket);
  void rebuildFromArrivalOrder();
  at::Tensor centralReadiness();
  void rebalanceChannels();
  bool unscale();
  bool unscaleInto(size_t i);
  bool afterUnscale(bool finite);
  void launchDirect(size_t b);
  void noteBucketReady(size_t b);
  void send(size_t b, const at::Tensor& wire);
  void resetStep();
  void tune(double exposed_this_step);
  void apply(const TuneConfig& c);

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<Transport> transport_;     // the one in use
  std::shared_ptr<Transport> flat_;          // as given
  std::vector<size_t> order_;                // agreed gradient arrival order (bucket planning)
  std::unique_ptr<Autotuner> tuner_;
  std::chrono::steady_clock::time_point last_finish_;
  WorldInfo world_;
  DataParallelOptions opt_;

  std::vector<at::Tensor> params_;
  std::vector<ParamInfo> infos_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // keeps hooks alive
  std::vector<uintptr_t> hook_keys_;

  BucketPlan plan_;
  std::vector<at::Tensor> buffers_;          // one flat fp32 buffer per bucket (undefined when direct_)
  std::vector<at::Tensor> wire_;             // fp16/bf16 transfer: the bucket's fp16/bf16 copy
  std::vector<int64_t> bucket_numel_;        // per bucket: elements (gradients, then any flags)
  bool direct_ = false;                      // CPU fp16/bf16: gradients convert straight to/from wire_
  std::vector<size_t> bucket_of_;            // param -> bucket
  std::vector<int64_t> offset_of_;           // param -> offset in its bucket buffer
  int64_t flags_at_ = -1;                    // detect_unused: offset of the flags in the last bucket

  // Per-step state, touched by the autograd thread (hooks) and the training thread.
  std::mutex mu_;
  std::vector<int> pending_;                 // per bucket: parameters still without gradient
  std::vector<char> ready_;                  // per param
  std::vector<char> had_grad_;               // per param: a local gradient existed at launch
  size_t next_launch_ = 0;
  std::vector<std::shared_ptr<Work>> works_;
  std::vector<size_t> arrival_;              // first step: order gradients arrived
  int64_t steps_ = 0;
  bool buffers_dirty_ = false;  // a training forward ran since the buffers last agreed
  std::atomic<bool> sync_{true};
  int channels_ = 1;
  std::vector<double> weights_;              // per channel, sums to 1
  std::vector<ChannelStats> last_stats_;     // per channel, at the previous rebalance
  double scale_ = 1;
  int clean_steps_ = 0;
  int64_t skipped_ = 0;
  double exposed_s_ = 0;
};

}  // namespace aiacc::comm
