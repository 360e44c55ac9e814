// DataParallel: LibTorch's missing DistributedDataParallel. Wrapping a model takes two lines
// besides the set-up (examples/ddp_minimal/train_ddp.cc is a whole program):
//
//   auto group = comm::initProcessGroup();                              // comm/process_group.h
//   comm::DataParallel dp(model, group.transports.primary, group.world);   // broadcasts rank 0's weights
//   ... dp.beforeForward(); loss = f(model(x)); loss.backward(); if (dp.finishBackward()) opt.step();
//
// A facade over parts that each have one job (see ../shared/docs/design.md):
//   - Reducer (comm/reducer.h): gradient hooks, bucket plan, ordered launch during backward,
//     averaged gradients back into .grad;
//   - BucketCodec (comm/bucket_codec.h): what a bucket sends (fp32, fp16 with its scale, bf16);
//   - StripedTransport (comm/striped_transport.h): each bucket spread over channels by speed;
//   - BufferPolicy (comm/buffer_sync.h): BatchNorm running statistics across ranks;
//   - Autotuner (comm/autotune.h): fusion cap, channels and two-level reduction, chosen in the
//     first steps from step times every rank averaged; DataParallel feeds it and applies its
//     choice through the Reducer's and the StripedTransport's setters.
// DataParallel itself composes them and keeps the order of their collectives, which must be the
// same on every rank. A CommError from any of them aborts every transport (the flat one and the
// two-level one) before it reaches the caller, so nothing left in flight, on any channel, waits
// out its timeout afterwards (the Reducer aborts before it waits for the rest of a failed step). No rank coordinates:
// every rank launches buckets in plan order as they fill (the classic coordinator, kept for comparison, is aiacc_bench
// negotiation's CentralSync). Calls only comm/.
#pragma once

#include <torch/nn/module.h>

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "aiacc/comm/autotune.h"
#include "aiacc/comm/bucket_codec.h"
#include "aiacc/comm/buffer_sync.h"
#include "aiacc/comm/gradient_sync.h"
#include "aiacc/comm/reducer.h"
#include "aiacc/comm/striped_transport.h"
#include "aiacc/comm/timeline.h"
#include "aiacc/comm/transport.h"

namespace aiacc::comm {

struct DataParallelOptions {
  double bucket_mb = kDefaultBucketMb;  // cap of a fused bucket
  double first_bucket_mb = 1;           // small first bucket: communication starts early in backward
  BufferSync buffers = kDefaultBufferSync;
  // Agree each step which parameters got a gradient on any rank; those that got none anywhere
  // keep an undefined .grad (the optimizer skips them). Off: every parameter gets the averaged
  // gradient (zeros where unused).
  bool detect_unused = false;
  // Channels a bucket is split across (0: all of the transport's); see StripingOptions.
  int channels = 0;
  bool balance_channels = true;
  double balance_alpha = 0.5;  // weight of the newest measurement in the moving average
  int64_t min_split_bytes = 256 * 1024;
  // Transfer dtype and fp16's own gradient scale (BucketCodec). Under AMP fp16 the loss
  // scaler's scale replaces it (shareLossScale): gradients arrive scaled once, never twice.
  // A non-finite reduced gradient is seen identically by every rank: all skip the step
  // (finishBackward returns false) and the scale halves; after scale_growth_steps clean steps it
  // doubles. Gradients stay fp32 in the model.
  TransferDtype transfer = TransferDtype::kFloat32;
  double grad_scale = 1024;
  int scale_growth_steps = 200;
  bool rebuild_after_first_step = true;
  // Autotune: from the second step on, try fusion caps, channel counts and (when two_level is
  // given) two-level reduction, a few steps each, and freeze the fastest (comm/autotune.h).
  // Every rank averages its step times with one allreduce, so all decide alike.
  bool autotune = false;
  TuneSpace tune_space;
  // A second transport over the same ranks (two-level reduction) the tuner may switch to.
  std::shared_ptr<Transport> two_level;
  // Tuner decisions and bucket readiness as instant events (rank 0).
  std::shared_ptr<Timeline> timeline;
  // Seconds on a monotonic clock, for the tuner's step times and the exposed communication
  // (tests inject a fake one).
  std::function<double()> clock;
  // Notices, one line each (the tuner's choice when it freezes), on every rank it is given to;
  // default: none (a library writes nothing to the process's streams).
  std::function<void(const std::string&)> log;
};

class DataParallel : public GradientSync {
 public:
  DataParallel(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<Transport> transport, const WorldInfo& world,
               const DataParallelOptions& options = {});
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  const WorldInfo& world() const override { return world_; }
  void beforeForward() override;
  void syncBuffers() override;
  bool finishBackward() override;
  void allreduceSum(at::Tensor& t) override;
  // Both transports' synchronize() (the tuner may have switched between them); syncBuffers()
  // ends with it, as the buffers are read next.
  void synchronize() override;
  double exposedCommSeconds() const override { return reducer_->exposedSeconds(); }
  std::string describe() const override;
  bool tuning() const override { return tuner_ && !tuner_->frozen(); }
  bool shareLossScale(std::shared_ptr<GradScale> scale) override { return codec_->shareScale(std::move(scale)); }
  CommState commState() const override;
  std::vector<std::string> restoreCommState(const CommState& state) override;
  // One byte OR over the ranks, submitted now on the control channel (behind this step's
  // buckets) and read at the next call: returns the OR of the previous call's flags (0 at the
  // first call). The last vote stays in flight; later collectives queue behind it alike on
  // every rank, and destruction waits for it.
  uint8_t voteFlags(uint8_t mine) override;
  const Autotuner* tuner() const { return tuner_.get(); }

  // Gradient accumulation: while sync is off, backward only accumulates into .grad locally
  // (no communication); the first backward with sync on reduces the accumulated sum.
  void setSync(bool on) { reducer_->setSync(on); }

  const BucketPlan& plan() const { return reducer_->plan(); }
  // Current share of a split bucket per channel (sums to 1); identical on every rank.
  const std::vector<double>& channelWeights() const { return striped_->weights(); }
  double gradScale() const { return codec_->scale(); }
  int64_t skippedSteps() const { return codec_->skippedSteps(); }
  const std::vector<ParamInfo>& params() const { return reducer_->params(); }

 private:
  Transport& control() const { return *striped_->inner(); }
  // Runs f; a CommError aborts every transport, then propagates.
  template <typename F>
  auto abortOnFailure(F&& f) -> decltype(f());
  bool finishBackwardImpl();
  void synchronizeTransports();
  void tune(double exposed_this_step);
  void apply(const TuneConfig& c);
  double now() const;

  std::shared_ptr<torch::nn::Module> module_;
  WorldInfo world_;
  DataParallelOptions opt_;
  std::shared_ptr<StripedTransport> flat_;       // over the transport given
  std::shared_ptr<StripedTransport> two_level_;  // over options.two_level, when given
  std::shared_ptr<StripedTransport> striped_;    // the one in use
  std::shared_ptr<BucketCodec> codec_;
  std::unique_ptr<Reducer> reducer_;
  BufferPolicy buffers_;
  std::unique_ptr<Autotuner> tuner_;
  double last_finish_ = 0;
  int64_t steps_ = 0;
  // The vote in flight (voteFlags), on the parameters' device; destruction waits for it.
  at::Tensor vote_;
  std::shared_ptr<Work> pending_vote_;
};

}  // namespace aiacc::comm
