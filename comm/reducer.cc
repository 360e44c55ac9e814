#include "aiacc/comm/reducer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>
#include <cstring>

namespace aiacc::comm {
namespace {

class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit GradReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

int64_t capBytes(double mb) { return std::max<int64_t>(1, static_cast<int64_t>(mb * 1024 * 1024)); }

}  // namespace

Reducer::Reducer(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<Transport> data,
                 std::shared_ptr<Transport> control, std::shared_ptr<BucketCodec> codec, const WorldInfo& world,
                 const ReducerOptions& options, std::shared_ptr<Timeline> timeline, std::function<double()> clock)
    : data_(std::move(data)), control_(std::move(control)), codec_(std::move(codec)), world_(world), opt_(options),
      timeline_(std::move(timeline)), clock_(std::move(clock)) {
  AIACC_CHECK_INPUT(!opt_.hook || codec_->dtype() == TransferDtype::kFloat32, "DataParallel: a comm hook (",
                    opt_.hook->name(),
                    ") decides what travels: leave the transfer at fp32 "
                    "(codec.dtype), not ",
                    transferDtypeName(codec_->dtype()));
  AIACC_CHECK_INPUT(!opt_.hook || opt_.launch_in_backward, "Reducer: a comm hook needs launch_in_backward");
  for (const auto& p : module->named_parameters()) {
    if (!p.value().requires_grad()) continue;
    params_.push_back(p.value());
    ParamInfo info;
    info.name = p.key();
    info.shape = p.value().sizes().vec();
    info.dtype = static_cast<int>(p.value().scalar_type());
    info.numel = p.value().numel();
    info.element_size = static_cast<int64_t>(p.value().element_size());
    info.device = p.value().device().str();
    infos_.push_back(info);
  }
  AIACC_CHECK_INPUT(!params_.empty(), "DataParallel: the module has no trainable parameters");
  order_ = reverseOrder(infos_.size());
  plan_ = planBuckets(infos_, order_, capBytes(opt_.first_bucket_mb), capBytes(opt_.bucket_mb));
  verifyFingerprints();
  buildBuckets();
  ready_.assign(params_.size(), 0);
  had_grad_.assign(params_.size(), 0);
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<GradReadyHook>([this, i] { onGradReady(i); })));
    accumulators_.push_back(std::move(acc));
  }
}

Reducer::~Reducer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
  // A step left unfinished (backward threw): its buckets may still be on the wire. After a
  // communication failure the transports are aborted already, and these end at once.
  for (auto& w : works_) {
    try {
      w->wait();
    } catch (...) {
    }
  }
}

void Reducer::abortTransports(const std::string& why) {
  data_->abort(why);
  if (control_ != data_) control_->abort(why);
}

void Reducer::waitAll(bool host) {
  const std::vector<std::shared_ptr<Work>> works = std::move(works_);
  works_.clear();
  try {
    comm::waitAll(works, host, [this](const std::string& why) { abortTransports(why); });
  } catch (...) {
    resetStep();
    throw;
  }
}

void Reducer::verifyFingerprints() {
  const int W = world_.world;
  // 1. Parameter counts: a different count is reported before per-parameter comparison.
  at::Tensor count = at::full({1}, static_cast<int64_t>(infos_.size()), at::kLong);
  at::Tensor counts = at::empty({W}, at::kLong);
  control_->allgather(count, counts, 0)->wait();
  for (int r = 0; r < W; ++r) {
    if (counts[r].item<int64_t>() != static_cast<int64_t>(infos_.size())) {
      throw CommError(strCat("model mismatch: rank ", r, " has ", counts[r].item<int64_t>(),
                             " trainable parameters, rank ", world_.rank, " has ", infos_.size()),
                      CommError::Remedy::kModel);
    }
  }
  // 2. Per-parameter fingerprints plus the plan's: the first difference is named.
  const size_t n = infos_.size();
  at::Tensor mine = at::empty({static_cast<int64_t>(n + 1)}, at::kLong);
  for (size_t i = 0; i < n; ++i) mine[static_cast<int64_t>(i)] = static_cast<int64_t>(paramFingerprint(infos_[i]));
  mine[static_cast<int64_t>(n)] = static_cast<int64_t>(planFingerprint(infos_, plan_));
  at::Tensor all = at::empty({W, static_cast<int64_t>(n + 1)}, at::kLong);
  control_->allgather(mine, all, 0)->wait();
  for (int r = 0; r < W; ++r) {
    for (size_t i = 0; i <= n; ++i) {
      if (all[r][static_cast<int64_t>(i)].item<int64_t>() == mine[static_cast<int64_t>(i)].item<int64_t>()) continue;
      if (i == n) {
        throw CommError(strCat("bucket plan mismatch between rank ", world_.rank, " and rank ", r,
                               " (a different bucket size on some rank?)"),
                        CommError::Remedy::kBucketSize);
      }
      std::string shape;
      for (int64_t d : infos_[i].shape) shape += (shape.empty() ? "" : "x") + std::to_string(d);
      throw CommError(strCat("model mismatch: parameter #", i, " ('", infos_[i].name, "', ", shape, " on rank ",
                             world_.rank, ") differs on rank ", r,
                             " (the same model, with the same outputs, on every rank?)"),
                      CommError::Remedy::kModel);
    }
  }
}

void Reducer::buildBuckets() {
  buffers_.clear();
  wire_.clear();
  bucket_numel_.clear();
  bucket_of_.assign(params_.size(), 0);
  offset_of_.assign(params_.size(), 0);
  pending_.assign(plan_.buckets.size(), 0);
  flags_at_ = -1;
  direct_ = codec_->direct(params_.front().device());
  const bool cast = codec_->wireType() != at::kFloat;
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    int64_t numel = 0;
    for (size_t i : plan_.buckets[b]) {
      bucket_of_[i] = b;
      offset_of_[i] = numel;
      numel += params_[i].numel();
    }
    // The unused-parameter flags ride on the last bucket, after its gradients, summed with them
    // (any rank's 1 makes the sum positive). The last bucket launches only after every other, so
    // every flag is known by then.
    const bool last = b + 1 == plan_.buckets.size();
    if (last && opt_.detect_unused && opt_.launch_in_backward && !opt_.hook &&
        params_[plan_.buckets[b].front()].is_floating_point()) {
      flags_at_ = numel;
      numel += static_cast<int64_t>(params_.size());
    }
    const at::TensorOptions options = params_[plan_.buckets[b].front()].options();
    AIACC_CHECK_INPUT(!cast || options.dtype() == at::kFloat,
                      "DataParallel: fp16/bf16 transfer needs fp32 parameters; '",
                      infos_[plan_.buckets[b].front()].name, "' is ", options.dtype());
    bucket_numel_.push_back(numel);
    buffers_.push_back(direct_ ? at::Tensor() : at::zeros({numel}, options));
    wire_.push_back(cast ? at::empty({numel}, options.dtype(codec_->wireType())) : buffers_.back());
    pending_[b] = static_cast<int>(plan_.buckets[b].size());
  }
  hooked_.clear();
  ++plan_generation_;
  if (opt_.hook) {
    for (size_t b = 0; b < buffers_.size(); ++b) {
      GradBucket g;
      g.index = b;
      g.world = world_.world;
      g.buffer = buffers_[b];
      g.last = b + 1 == buffers_.size();
      g.params = plan_.buckets[b];
      g.plan = plan_generation_;
      hooked_.push_back(std::move(g));
    }
  }
  next_launch_ = 0;
}

void Reducer::onGradReady(size_t i) {
  if (on_gradient_) on_gradient_();
  if (!sync_) return;
  std::lock_guard<std::mutex> lock(mu_);
  stopIfStepFailed();
  // Autograd sums every use of a parameter before its accumulator fires, once per backward: a
  // second firing is a second backward before finishBackward(), whose gradient the bucket, maybe
  // already on the wire, would drop. PyTorch's DDP refuses it too.
  AIACC_CHECK_INPUT(!ready_[i], "DataParallel: the gradient of '", infos_[i].name,
                    "' became ready twice before finishBackward() (a second backward, or the parameter used in "
                    "two reentrant backward passes); call finishBackward() after every backward, or "
                    "setSync(false) to accumulate gradients locally (no_sync)");
  ready_[i] = 1;
  if (steps_ == 0) arrival_.push_back(i);
  const size_t b = bucket_of_[i];
  if (--pending_[b] == 0 && opt_.launch_in_backward) {
    while (next_launch_ < pending_.size() && pending_[next_launch_] == 0) launch(next_launch_++);
  }
}

// A bucket of this step has failed already (a peer died, a transport was aborted): the step is
// lost on every rank, and what backward would still compute goes nowhere. The failure is raised
// here, in the gradient hook, which ends backward (autograd hands it to backward()'s caller),
// after the transports are aborted as for a failed launch; the rest of backward, up to most of a
// step, is saved before an elastic job regroups or a fixed one stops. (Transports that cannot
// tell a failure without blocking, NCCL's, raise it at finish() as before.)
void Reducer::stopIfStepFailed() {
  if (Failure f = firstFailure(works_)) {
    abortTransports(abortReason(f.what()));
    f.raise();
  }
}

// Fills the bucket's wire through the codec, adds the gradient flags to the last bucket, launches.
void Reducer::launch(size_t b) {
  at::NoGradGuard no_grad;
  if (direct_) {
    fillDirect(b);
  } else {
    fill(b);
    if (!opt_.hook) codec_->encode(buffers_[b], wire_[b], world_.world);
  }
  if (timeline_) {  // when each bucket's gradients were complete: the scaling model's input
    const int64_t bytes = bucket_numel_[b] * static_cast<int64_t>(params_[plan_.buckets[b].front()].element_size());
    timeline_->instant("bucket ready", 0, {{"bucket", static_cast<int64_t>(b)}, {"bytes", bytes}});
  }
  if (opt_.hook) {
    // Whatever the hook throws (its own check, a CommError), this rank will not send what its
    // peers wait for: the transports are aborted before the error leaves, as for a failed launch.
    try {
      std::shared_ptr<Work> w = opt_.hook->launch(hooked_[b], *data_);
      AIACC_CHECK_INPUT(w != nullptr, "DataParallel: the comm hook '", opt_.hook->name(), "' returned no Work");
      works_.push_back(std::move(w));
    } catch (const std::exception& e) {
      abortTransports(abortReason(e));
      throw;
    }
    return;
  }
  if (flags_at_ >= 0 && b + 1 == wire_.size()) {  // this rank's gradient flags, as 1 or 0
    const at::Tensor flags = at::from_blob(had_grad_.data(), {static_cast<int64_t>(had_grad_.size())}, at::kByte);
    wire_[b].narrow(0, flags_at_, flags.numel()).copy_(flags);
  }
  try {
    works_.push_back(data_->allreduce(wire_[b], ReduceOp::kSum, 0));
  } catch (const std::exception& e) {  // a transport that fails at submission (NCCL, after an error)
    abortTransports(abortReason(e));
    throw;
  }
}

// A gradient a bucket can hold: dense (strided). A sparse one (e.g. an Embedding with
// sparse=true) is refused by name instead of failing inside reshape().
void Reducer::checkDense(size_t i, const at::Tensor& g) const {
  AIACC_CHECK_INPUT(g.layout() == at::kStrided, "DataParallel: the gradient of '", infos_[i].name, "' is ",
                    g.is_sparse() ? "sparse" : "not a dense tensor", " (layout ", g.layout(),
                    "); DataParallel reduces dense gradients only: make the module produce dense gradients "
                    "(e.g. an Embedding without sparse=true)");
}

// The bucket's gradients into its fp32 buffer (zeros where a parameter has none).
void Reducer::fill(size_t b) {
  at::Tensor& buf = buffers_[b];
  for (size_t i : plan_.buckets[b]) {
    at::Tensor slot = buf.narrow(0, offset_of_[i], params_[i].numel());
    const at::Tensor& g = params_[i].grad();
    if (g.defined()) checkDense(i, g);
    had_grad_[i] = g.defined();
    if (g.defined()) {
      slot.copy_(g.reshape(-1));
    } else {
      slot.zero_();
    }
  }
}

// The bucket's gradients converted one parameter at a time straight into its wire (zeros where
// a parameter has none).
void Reducer::fillDirect(size_t b) {
  for (size_t i : plan_.buckets[b]) {
    const at::Tensor& g = params_[i].grad();
    had_grad_[i] = g.defined();
    at::Tensor slot = wire_[b].narrow(0, offset_of_[i], params_[i].numel());
    if (!g.defined()) {
      std::memset(slot.data_ptr(), 0, static_cast<size_t>(slot.nbytes()));  // +0.0 in fp16 and bf16
      continue;
    }
    checkDense(i, g);
    const at::Tensor c = g.is_contiguous() ? g : g.contiguous();  // e.g. a channels-last weight
    codec_->encodeInto(c, slot, world_.world);
  }
}

at::Tensor Reducer::localGradientFlags() const {
  const int64_t P = static_cast<int64_t>(params_.size());
  at::Tensor mine = at::empty({P}, at::kByte);
  for (int64_t i = 0; i < P; ++i) mine.data_ptr<uint8_t>()[i] = params_[static_cast<size_t>(i)].grad().defined();
  return mine;
}

void Reducer::launchRemaining() {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    // Buckets with parameters that got no gradient this step are launched now, still in order.
    while (next_launch_ < pending_.size()) launch(next_launch_++);
  } catch (...) {
    try {
      waitAll(false);  // launch() aborted the transports: the buckets already launched end at once
    } catch (...) {    // the launch failure is the one to report
    }
    resetStep();
    throw;
  }
}

bool Reducer::finish(const at::Tensor& agreed) {
  launchRemaining();  // (nothing left when the caller launched them)
  const auto now = [this] {
    return clock_ ? clock_()
                  : std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  const double t0 = now();
  // Over a device-ordered transport (NCCL) wait() only orders the streams. Where the host reads
  // the reduced buckets next (a reduced-precision wire's finiteness check, the unused-parameter
  // flags), the host blocks for them here instead, so that a failed reduction raises before its
  // values are read (elsewhere the next operation, or synchronize(), raises it).
  waitAll(/*host=*/codec_->wireType() != at::kFloat || flags_at_ >= 0 || opt_.hook != nullptr);
  last_exposed_s_ = now() - t0;
  exposed_s_ += last_exposed_s_;
  at::NoGradGuard no_grad;
  bool finite = true;
  if (!direct_) {
    if (opt_.hook) {
      finite = finishHook();
    } else {
      for (size_t b = 0; b < wire_.size(); ++b) finite &= codec_->decode(wire_[b], buffers_[b]);
    }
    if (!finite) {
      if (opt_.hook) ++hook_skipped_;
      codec_->endStep(false);
      resetStep();
      return false;
    }
  }
  // Which parameters got a gradient anywhere: the flags that rode on the last bucket, or one
  // bitwise-or allreduce; no coordinator.
  at::Tensor anywhere = agreed;
  if (opt_.detect_unused && !anywhere.defined() && flags_at_ >= 0) {
    const at::Tensor& reduced = wire_.back();
    anywhere =
        reduced.narrow(0, flags_at_, static_cast<int64_t>(params_.size())).gt(0).to(at::kByte).cpu().contiguous();
  } else if (opt_.detect_unused && !anywhere.defined()) {
    anywhere = at::from_blob(had_grad_.data(), {static_cast<int64_t>(had_grad_.size())}, at::kByte).clone();
    control_->allreduce(anywhere, ReduceOp::kBitwiseOr, 0)->wait();
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (anywhere.defined() && anywhere.data_ptr<uint8_t>()[i] == 0) continue;
    if (direct_) {
      finite &= decodeInto(i);
      continue;
    }
    at::Tensor avg = buffers_[bucket_of_[i]].narrow(0, offset_of_[i], params_[i].numel()).view_as(params_[i]);
    if (params_[i].grad().defined()) {
      params_[i].mutable_grad().copy_(avg);
    } else {
      params_[i].mutable_grad() = avg.clone();
    }
  }
  if (!codec_->endStep(finite)) {
    resetStep();
    return false;
  }
  const bool rebuild = steps_ == 0 && opt_.rebuild_after_first_step && !rebuilt_;
  ++steps_;
  if (rebuild) {
    rebuildFromArrivalOrder();
  } else {
    resetStep();
  }
  return true;
}

// The hook's finish() for every bucket, in plan order; false when any says to skip the step. A
// hook that throws, or that replaced a bucket's buffer, leaves the Reducer ready for the next step
// (buffers restored, no state kept) before the error leaves.
bool Reducer::finishHook() {
  bool keep = true;
  std::string replaced;
  try {
    for (GradBucket& g : hooked_) {
      keep &= opt_.hook->finish(g);
      if (!g.buffer.is_same(buffers_[g.index]) && replaced.empty()) replaced = std::to_string(g.index);
    }
  } catch (...) {
    for (GradBucket& g : hooked_) g.buffer = buffers_[g.index], g.state = at::Tensor();
    resetStep();
    throw;
  }
  for (GradBucket& g : hooked_) g.buffer = buffers_[g.index], g.state = at::Tensor();
  if (!replaced.empty()) {
    resetStep();
    AIACC_THROW(InputError, "DataParallel: the comm hook '", opt_.hook->name(), "' replaced bucket.buffer (bucket ",
                replaced, "): write the result into it (copy_)");
  }
  return keep;
}

// Parameter i's reduced gradient from the wire into its .grad (allocated when this rank had
// none). Returns false when any value is inf or nan.
bool Reducer::decodeInto(size_t i) {
  const at::Tensor slot = wire_[bucket_of_[i]].narrow(0, offset_of_[i], params_[i].numel());
  at::Tensor& g = params_[i].mutable_grad();
  if (!g.defined()) g = at::empty(params_[i].sizes(), params_[i].options());
  at::Tensor out = g.is_contiguous() ? g : at::empty(g.sizes(), g.options());
  const bool finite = codec_->decodeInto(slot, out);
  if (!out.is_same(g)) g.copy_(out);
  return finite;
}

void Reducer::setBucketCap(double mb) {
  if (mb == opt_.bucket_mb) return;
  opt_.bucket_mb = mb;
  std::lock_guard<std::mutex> lock(mu_);
  plan_ = planBuckets(infos_, order_, capBytes(opt_.first_bucket_mb), capBytes(opt_.bucket_mb));
  buildBuckets();
}

void Reducer::setTransports(std::shared_ptr<Transport> data, std::shared_ptr<Transport> control) {
  data_ = std::move(data);
  control_ = std::move(control);
}

// Rank 0's arrival order (parameters that never arrived go last, in reverse registration order)
// is broadcast, and every rank rebuilds the same plan from it.
void Reducer::rebuildFromArrivalOrder() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<char> seen(params_.size(), 0);
  std::vector<int64_t> order;
  for (size_t i : arrival_) {
    order.push_back(static_cast<int64_t>(i));
    seen[i] = 1;
  }
  for (size_t i : reverseOrder(params_.size())) {
    if (!seen[i]) order.push_back(static_cast<int64_t>(i));
  }
  at::Tensor t = at::tensor(order, at::kLong);
  control_->broadcast(t, 0, 0)->wait();
  std::vector<size_t> agreed(params_.size());
  for (size_t k = 0; k < agreed.size(); ++k)
    agreed[k] = static_cast<size_t>(t[static_cast<int64_t>(k)].item<int64_t>());
  order_ = agreed;
  rebuilt_ = true;
  plan_ = planBuckets(infos_, order_, capBytes(opt_.first_bucket_mb), capBytes(opt_.bucket_mb));
  buildBuckets();
  std::fill(ready_.begin(), ready_.end(), 0);
  arrival_.clear();
}

std::vector<int64_t> Reducer::rebuiltOrder() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!rebuilt_) return {};
  return std::vector<int64_t>(order_.begin(), order_.end());
}

void Reducer::restoreOrder(const std::vector<int64_t>& order) {
  CommState only_order;
  only_order.bucket_order = order;
  checkCommState(only_order, params_.size());
  std::lock_guard<std::mutex> lock(mu_);
  order_.assign(order.begin(), order.end());
  rebuilt_ = true;
  plan_ = planBuckets(infos_, order_, capBytes(opt_.first_bucket_mb), capBytes(opt_.bucket_mb));
  buildBuckets();
  std::fill(ready_.begin(), ready_.end(), 0);
  arrival_.clear();
}

void Reducer::resetStep() {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t b = 0; b < plan_.buckets.size(); ++b) pending_[b] = static_cast<int>(plan_.buckets[b].size());
  std::fill(ready_.begin(), ready_.end(), 0);
  next_launch_ = 0;
  arrival_.clear();
}

}  // namespace aiacc::comm
