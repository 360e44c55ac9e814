// DataParallel: LibTorch's missing DistributedDataParallel. A program adds the process group
// and one object (examples/ddp_minimal/train_ddp.cc is a whole program):
//
//   auto group = comm::initProcessGroup();          // process_group.h: the launcher's variables
//   comm::DataParallel dp(model, group);            // broadcasts rank 0's weights
//   ... loss = f(model(x)); loss.backward(); opt.step();   // gradients averaged inside backward()
//
// (BatchNorm: dp.beforeForward() before each training forward, dp.syncBuffers() before
// evaluating or saving; see syncBuffers.)
//
// A facade over parts that each have one job (the library's own, not installed; docs/design.md
// draws them; their options are in options.h):
//   - Reducer: gradient hooks, bucket plan, ordered launch during backward, averaged gradients
//     back into .grad;
//   - BucketCodec: what a bucket sends (fp32, fp16 with its scale, bf16);
//   - StripedTransport: each bucket spread over channels by speed;
//   - BufferPolicy: BatchNorm running statistics across ranks;
//   - Autotuner: fusion cap, channels and two-level reduction, chosen in the
//     first steps from step times every rank averaged; DataParallel feeds it and applies its
//     choice through the Reducer's and the StripedTransport's setters.
// DataParallel itself composes them and keeps the order of their collectives, which must be the
// same on every rank. Its parts live behind a pointer (pimpl): their layout can change without a
// program built against this header noticing (the option structs, which it includes, are part
// of the interface). At construction the ranks compare their options
// (optionSettings) and the model's parameters: a difference is an error on every rank, naming it.
// A CommError from any part aborts every transport (the flat one and the two-level one) before it
// reaches the caller, so nothing left in flight, on any channel, waits out its timeout afterwards
// (the Reducer aborts before it waits for the rest of a failed step). A bucket that fails while
// backward goes on ends backward at the next gradient with that CommError (backward() throws it):
// the transports are aborted then, so the DataParallel is spent; destroy it (an elastic program
// builds a new one for the next group). No rank coordinates: every
// rank launches buckets in plan order as they fill (the classic coordinator, kept for comparison,
// is aiacc_bench negotiation's CentralSync). Calls only comm/.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <vector>

#include "aiacc/comm/bucket_plan.h"
#include "aiacc/comm/data_parallel_options.h"
#include "aiacc/comm/gradient_sync.h"
#include "aiacc/comm/process_group.h"  // a program includes this header alone
#include "aiacc/comm/transport.h"

namespace aiacc::comm {

class Autotuner;  // the library's own (DataParallel::tuner())

class DataParallel : public GradientSync {
 public:
  // Expects: `module` on one device, with the same parameters (names, shapes, dtypes) on every
  // rank; `transport` the process group's (rank and size those of `world`); the same options on
  // every rank. A collective: every rank constructs its DataParallel at the same point.
  // Guarantees: rank 0's parameters (unless options.broadcast_parameters is off) and buffers are
  // in every rank's module on return.
  // Throws InputError for a null model or transport, a transport of another world, parameters on
  // several devices, options or a hook that differ across ranks (naming the first differing
  // option and both values), a comm hook with a reduced-precision transfer; CommError for a model
  // that differs across ranks, or a rank that does not arrive.
  DataParallel(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<Transport> transport, const WorldInfo& world,
               const DataParallelOptions& options = {});
  // Over a process group (process_group.h): its primary transport and world, and its
  // two-level transport for the tuner where it made one. The options default to the AIACC_*
  // variables' (optionsFromEnvironment: the defaults where none is set).
  DataParallel(std::shared_ptr<torch::nn::Module> module, const ProcessGroup& group,
               const DataParallelOptions& options = optionsFromEnvironment());
  // A module holder (torch::nn::Sequential, a TORCH_MODULE(Net)): the module it holds, shared.
  template <typename M>
  DataParallel(const torch::nn::ModuleHolder<M>& module, const ProcessGroup& group,
               const DataParallelOptions& options = optionsFromEnvironment())
      : DataParallel(std::static_pointer_cast<torch::nn::Module>(module.ptr()), group, options) {}
  template <typename M>
  DataParallel(const torch::nn::ModuleHolder<M>& module, std::shared_ptr<Transport> transport, const WorldInfo& world,
               const DataParallelOptions& options = {})
      : DataParallel(std::static_pointer_cast<torch::nn::Module>(module.ptr()), std::move(transport), world, options) {}
  // A module the caller owns by value (`Net net;`): it must outlive this DataParallel.
  DataParallel(torch::nn::Module& module, const ProcessGroup& group,
               const DataParallelOptions& options = optionsFromEnvironment());
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  const WorldInfo& world() const override;
  void beforeForward() override;
  void syncBuffers() override;
  // After backward (options.finish_in_backward off; on, backward() has done it and this returns
  // its result): the step's averaged gradients in .grad, or false when every rank skips the step.
  bool finishBackward() override;
  // Whether every rank skipped the last finished step (a non-finite fp16 transfer, a comm hook's
  // verdict): its .grad were left undefined (finish_in_backward) and the optimizer did nothing.
  bool lastStepSkipped() const;
  void allreduceSum(at::Tensor& t) override;
  void broadcast(at::Tensor& t, int root) override;
  // Both transports' synchronize() (the tuner may have switched between them); syncBuffers()
  // ends with it, as the buffers are read next.
  void synchronize() override;
  double exposedCommSeconds() const override;
  std::string describe() const override;
  bool tuning() const override;
  bool shareLossScale(std::shared_ptr<GradScale> scale) override;
  CommState commState() const override;
  std::vector<std::string> restoreCommState(const CommState& state) override;
  // One byte OR over the ranks, submitted now on the control channel (behind this step's
  // buckets) and read at the next call: returns the OR of the previous call's flags (0 at the
  // first call). The last vote stays in flight; later collectives queue behind it alike on
  // every rank, and destruction waits for it.
  uint8_t voteFlags(uint8_t mine) override;
  // The tuner (null without autotune, or alone): for aiacc's own tests, which see its class; a
  // program reads the tuner's choice from describe() and commState().tuned.
  const Autotuner* tuner() const;

  // Gradient accumulation: while sync is off, backward only accumulates into .grad locally
  // (no communication); the first backward with sync on reduces the accumulated sum.
  void setSync(bool on);

  const BucketPlan& plan() const;
  // Current share of a split bucket per channel (sums to 1); identical on every rank.
  const std::vector<double>& channelWeights() const;
  double gradScale() const;
  // Steps every rank skipped: a non-finite reduced gradient (the codec's check), or a comm hook's
  // verdict.
  int64_t skippedSteps() const;
  const std::vector<ParamInfo>& params() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace aiacc::comm
