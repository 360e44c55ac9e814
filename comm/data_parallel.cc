#include "comm/data_parallel.h"

#include "comm/half.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>
#include <cstring>
#include <iostream>
#include <map>

namespace aiacc::comm {
namespace {

class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

void coalesced(const std::vector<at::Tensor>& list, const std::function<void(at::Tensor&)>& op);

}  // namespace

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module> module,
                           std::shared_ptr<Transport> transport, const WorldInfo& world,
                           const DataParallelOptions& options)
    : module_(std::move(module)), transport_(std::move(transport)), flat_(transport_), world_(world), opt_(options) {
  AIACC_CHECK(transport_->size() == world_.world && transport_->rank() == world_.rank,
              "transport is rank ", transport_->rank(), "/", transport_->size(), ", world says ",
              world_.rank, "/", world_.world);
  for (const auto& p : module_->named_parameters()) {
    if (!p.value().requires_grad()) continue;
    params_.push_back(p.value());
    ParamInfo info;
    info.name = p.key();
    info.shape = p.value().sizes().vec();
    info.dtype = static_cast<int>(p.value().scalar_type());
    info.numel = p.value().numel();
    info.element_size = static_cast<int64_t>(p.value().element_size());
    infos_.push_back(info);
  }
  AIACC_CHECK_INPUT(!params_.empty(), "DataParallel: the module has no trainable parameters");
  channels_ = opt_.channels > 0 ? std::min(opt_.channels, transport_->channels()) : transport_->channels();
  weights_.assign(static_cast<size_t>(channels_), 1.0 / channels_);
  scale_ = opt_.transfer == TransferDtype::kFloat16 ? opt_.grad_scale : 1.0;  // bf16: no scaling
  for (int c = 0; c < channels_; ++c) last_stats_.push_back(transport_->channelStats(c));
  const auto mb = [](double m) { return std::max<int64_t>(1, static_cast<int64_t>(m * 1024 * 1024)); };
  order_ = reverseOrder(infos_.size());
  plan_ = planBuckets(infos_, order_, mb(opt_.first_bucket_mb), mb(opt_.bucket_mb));
  verifyFingerprints();
  broadcastState(/*parameters=*/true, /*buffers=*/true);
  buildBuckets(plan_);
  ready_.assign(params_.size(), 0);
  had_grad_.assign(params_.size(), 0);
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<GradReadyHook>([this, i] { onGradReady(i); })));
    accumulators_.push_back(std::move(acc));
  }
  if (opt_.autotune && world_.world > 1) {
    AIACC_CHECK(!opt_.two_level || (opt_.two_level->size() == world_.world && opt_.two_level->rank() == world_.rank),
                "DataParallel: the two-level transport spans other ranks");
    TuneSpace space = opt_.tune_space;
    space.try_two_level = space.try_two_level && opt_.two_level != nullptr;
    for (int& k : space.channels) k = std::min(k, transport_->channels());
    // Two-level first where it is available: between nodes it sends 1/ranks-per-node of the
    // flat ring's bytes over the network and, on hosts whose cores are all busy, leaves them
    // less TCP work; flat must then beat it by more than noise. (Starting flat, a tie within
    // the lab's step-to-step noise kept flat, 5-10% slower there: 85-90 against 93-98 images/s.)
    tuner_ = std::make_unique<Autotuner>(TuneConfig{opt_.bucket_mb, channels_, space.try_two_level}, space);
    apply(tuner_->current());
  }
  last_finish_ = std::chrono::steady_clock::now();
}

DataParallel::~DataParallel() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
  for (auto& w : works_) {
    try {
      w->wait();
    } catch (...) {
    }
  }
}

void DataParallel::verifyFingerprints() {
  const int W = world_.world;
  // 1. Parameter counts: a different count is reported before per-parameter comparison.
  at::Tensor count = at::full({1}, static_cast<int64_t>(infos_.size()), at::kLong);
  at::Tensor counts = at::empty({W}, at::kLong);
  transport_->allgather(count, counts, opt_.channel)->wait();
  for (int r = 0; r < W; ++r) {
    if (counts[r].item<int64_t>() != static_cast<int64_t>(infos_.size())) {
      AIACC_THROW(CommError, "model mismatch: rank ", r, " has ", counts[r].item<int64_t>(),
                  " trainable parameters, rank ", world_.rank, " has ", infos_.size());
    }
  }
  // 2. Per-parameter fingerprints plus the plan's: the first difference is named.
  const size_t n = infos_.size();
  at::Tensor mine = at::empty({static_cast<int64_t>(n + 1)}, at::kLong);
  for (size_t i = 0; i < n; ++i) mine[static_cast<int64_t>(i)] = static_cast<int64_t>(paramFingerprint(infos_[i]));
  mine[static_cast<int64_t>(n)] = static_cast<int64_t>(planFingerprint(infos_, plan_));
  at::Tensor all = at::empty({W, static_cast<int64_t>(n + 1)}, at::kLong);
  transport_->allgather(mine, all, opt_.channel)->wait();
  for (int r = 0; r < W; ++r) {
    for (size_t i = 0; i <= n; ++i) {
      if (all[r][static_cast<int64_t>(i)].item<int64_t>() == mine[static_cast<int64_t>(i)].item<int64_t>()) continue;
      if (i == n) {
        AIACC_THROW(CommError, "bucket plan mismatch between rank ", world_.rank, " and rank ", r,
                    " (different --bucket-mb?)");
      }
      std::string shape;
      for (int64_t d : infos_[i].shape) shape += (shape.empty() ? "" : "x") + std::to_string(d);
      AIACC_THROW(CommError, "model mismatch: parameter #", i, " ('", infos_[i].name, "', ", shape,
                  " on rank ", world_.rank, ") differs on rank ", r,
                  " (same --arch and number of classes on every rank?)");
    }
  }
}

namespace {

// Flattens tensors of one dtype into one buffer, lets op transform it, copies the result back:
// one collective instead of one per tensor.
void coalesced(const std::vector<at::Tensor>& list, const std::function<void(at::Tensor&)>& op) {
  if (list.empty()) return;
  std::vector<at::Tensor> flat;
  for (const auto& t : list) flat.push_back(t.reshape(-1));
  at::Tensor buf = at::cat(flat);
  op(buf);
  int64_t off = 0;
  for (auto t : list) {
    t.copy_(buf.narrow(0, off, t.numel()).view_as(t));
    off += t.numel();
  }
}

}  // namespace

void DataParallel::broadcastState(bool parameters, bool buffers) {
  at::NoGradGuard no_grad;
  std::map<at::ScalarType, std::vector<at::Tensor>> by_type;
  if (parameters) {
    for (const auto& p : module_->parameters()) by_type[p.scalar_type()].push_back(p);
  }
  if (buffers) {
    for (const auto& b : module_->buffers()) by_type[b.scalar_type()].push_back(b);
  }
  for (auto& [type, list] : by_type) {
    coalesced(list, [&](at::Tensor& buf) { transport_->broadcast(buf, 0, opt_.channel)->wait(); });
  }
}

void DataParallel::buildBuckets(const BucketPlan& plan) {
  buffers_.clear();
  wire_.clear();
  bucket_numel_.clear();
  bucket_of_.assign(params_.size(), 0);
  offset_of_.assign(params_.size(), 0);
  pending_.assign(plan.buckets.size(), 0);
  flags_at_ = -1;
  // CPU fp16/bf16 transfer converts each gradient straight into the wire buffer and back into
  // .grad: no fp32 bucket (two fewer passes over the gradients, and its memory saved). The fp32
  // buckets remain for fp32 transfer, and on the GPU, where the casts run on the device.
  direct_ = opt_.transfer != TransferDtype::kFloat32 && !params_.empty() && params_.front().device().is_cpu();
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    int64_t numel = 0;
    for (size_t i : plan.buckets[b]) {
      bucket_of_[i] = b;
      offset_of_[i] = numel;
      numel += params_[i].numel();
    }
    // Decentralized unused-parameter detection rides on the last bucket: one flag per parameter
    // after its gradients, summed with them (any rank's 1 makes the sum positive). The last
    // bucket launches only after every other, so every flag is known by then: no collective of
    // its own.
    const bool last = b + 1 == plan.buckets.size();
    if (last && opt_.detect_unused && opt_.negotiation == Negotiation::kDecentralized &&
        params_[plan.buckets[b].front()].is_floating_point()) {
      flags_at_ = numel;
      numel += static_cast<int64_t>(params_.size());
    }
    const at::TensorOptions options = params_[plan.buckets[b].front()].options();
    if (opt_.transfer != TransferDtype::kFloat32) {
      AIACC_CHECK(options.dtype() == at::kFloat, "fp16/bf16 transfer needs fp32 parameters");
      wire_.push_back(at::empty({numel}, options.dtype(opt_.transfer == TransferDtype::kFloat16 ? at::kHalf
                                                                                                : at::kBFloat16)));
    }
    bucket_numel_.push_back(numel);
    buffers_.push_back(direct_ ? at::Tensor() : at::zeros({numel}, options));
    pending_[b] = static_cast<int>(plan.buckets[b].size());
  }
  next_launch_ = 0;
}

void DataParallel::beforeForward() {
  if (world_.world == 1) return;
  if (opt_.buffers == BufferSync::kBroadcast) broadcastState(false, true);
  if (opt_.buffers == BufferSync::kAverage) averageBuffers();
  buffers_dirty_ = true;
}

// Only after a training forward changed them: averaging values that already agree would be
// a wasted collective (and, for world sizes that are not powers of two, not quite a no-op).
void DataParallel::syncBuffers() {
  if (world_.world == 1 || !buffers_dirty_) return;
  if (opt_.buffers == BufferSync::kBroadcast) broadcastState(false, true);
  if (opt_.buffers == BufferSync::kAverage || opt_.buffers == BufferSync::kAverageWhenRead) averageBuffers();
  buffers_dirty_ = false;
}

// Floating-point buffers (running mean/var) are averaged; integer ones (num_batches_tracked)
// are identical on every rank already.
void DataParallel::averageBuffers() {
  at::NoGradGuard no_grad;
  std::map<at::ScalarType, std::vector<at::Tensor>> by_type;
  for (const auto& b : module_->buffers()) {
    if (b.is_floating_point()) by_type[b.scalar_type()].push_back(b);
  }
  for (auto& [type, list] : by_type) {
    coalesced(list, [&](at::Tensor& buf) {
      transport_->allreduce(buf, ReduceOp::kSum, opt_.channel)->wait();
      buf.div_(world_.world);
    });
  }
}

void DataParallel::onGradReady(size_t i) {
  if (!sync_) return;
  std::lock_guard<std::mutex> lock(mu_);
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
  if (--pending_[b] == 0 && opt_.negotiation == Negotiation::kDecentralized) {
    while (next_launch_ < pending_.size() && pending_[next_launch_] == 0) launch(next_launch_++);
  }
}

// Copies the bucket's gradients in (zeros where a parameter has none), averages, launches.
void DataParallel::launch(size_t b) {
  at::NoGradGuard no_grad;
  if (direct_) {
    launchDirect(b);
    return;
  }
  at::Tensor& buf = buffers_[b];
  for (size_t i : plan_.buckets[b]) {
    at::Tensor slot = buf.narrow(0, offset_of_[i], params_[i].numel());
    const at::Tensor& g = params_[i].grad();
    had_grad_[i] = g.defined();
    if (g.defined()) {
      slot.copy_(g.reshape(-1));
    } else {
      slot.zero_();
    }
  }
  noteBucketReady(b);
  at::Tensor wire = buf;
  if (opt_.transfer != TransferDtype::kFloat32) {
    // GPU (CPU takes launchDirect): the cast runs on the device, on the current (backward) stream.
    wire = wire_[b];
    wire.copy_(buf.mul(static_cast<float>(scale_ / world_.world)));
  } else {
    buf.div_(world_.world);
  }
  send(b, wire);
}

// The bucket's gradients, times scale / world size, converted one parameter at a time straight
// into the bucket's fp16/bf16 wire buffer (zeros where a parameter has none); then launched.
void DataParallel::launchDirect(size_t b) {
  at::Tensor& wire = wire_[b];
  auto* bits = static_cast<uint16_t*>(wire.data_ptr());
  const auto s = static_cast<float>(scale_ / world_.world);
  for (size_t i : plan_.buckets[b]) {
    const at::Tensor& g = params_[i].grad();
    had_grad_[i] = g.defined();
    uint16_t* slot = bits + offset_of_[i];
    const auto n = static_cast<size_t>(params_[i].numel());
    if (!g.defined()) {
      std::memset(slot, 0, n * sizeof(uint16_t));  // +0.0 in fp16 and bf16
      continue;
    }
    const at::Tensor c = g.is_contiguous() ? g : g.contiguous();  // e.g. a channels-last weight
    if (opt_.transfer == TransferDtype::kFloat16) {
      floatToHalf(c.data_ptr<float>(), slot, n, s);
    } else {
      floatToBf16(c.data_ptr<float>(), slot, n, s);
    }
  }
  noteBucketReady(b);
  send(b, wire);
}

void DataParallel::noteBucketReady(size_t b) {
  if (opt_.timeline) {  // when each bucket's gradients were complete: the scaling model's input
    const int64_t bytes = bucket_numel_[b] * static_cast<int64_t>(params_[plan_.buckets[b].front()].element_size());
    opt_.timeline->instant("bucket ready", 0, strCat("{\"bucket\": ", b, ", \"bytes\": ", bytes, "}"));
  }
}

// Adds the gradient flags to the last bucket, then launches its allreduce on one channel, or
// split across the channels in proportion to their weights.
void DataParallel::send(size_t b, const at::Tensor& wire) {
  if (flags_at_ >= 0 && b + 1 == buffers_.size()) {  // this rank's gradient flags, as 1 or 0
    const at::Tensor flags = at::from_blob(had_grad_.data(), {static_cast<int64_t>(had_grad_.size())}, at::kByte);
    wire.narrow(0, flags_at_, flags.numel()).copy_(flags);
  }
  const int64_t n = wire.numel();
  if (channels_ == 1 || static_cast<int64_t>(wire.nbytes()) < opt_.min_split_bytes) {
    const int c = channels_ == 1 ? opt_.channel : static_cast<int>(b % static_cast<size_t>(channels_));
    works_.push_back(transport_->allreduce(wire, ReduceOp::kSum, c));
    return;
  }
  // Split in proportion to the channel weights; the last channel takes the rounding remainder.
  int64_t off = 0;
  for (int c = 0; c < channels_; ++c) {
    const int64_t len = c == channels_ - 1 ? n - off
                                           : static_cast<int64_t>(static_cast<double>(n) * weights_[static_cast<size_t>(c)]);
    if (len > 0) works_.push_back(transport_->allreduce(wire.narrow(0, off, len), ReduceOp::kSum, c));
    off += len;
  }
}

// Every rank measured each channel's bytes/s over the last step; the sum over ranks (one small
// allreduce) is the same everywhere, so every rank derives the same new weights from it.
void DataParallel::rebalanceChannels() {
  if (channels_ < 2 || !opt_.balance_channels) return;
  at::Tensor rate = at::zeros({channels_}, at::kDouble);
  for (int c = 0; c < channels_; ++c) {
    const ChannelStats now = transport_->channelStats(c);
    ChannelStats& last = last_stats_[static_cast<size_t>(c)];
    const double bytes = now.bytes - last.bytes, secs = now.busy_s - last.busy_s;
    rate.data_ptr<double>()[c] = secs > 0 && bytes > 0 ? bytes / secs : 0.0;
  }
  transport_->allreduce(rate, ReduceOp::kSum, opt_.channel)->wait();
  for (int c = 0; c < channels_; ++c) last_stats_[static_cast<size_t>(c)] = transport_->channelStats(c);
  const double* r = rate.data_ptr<double>();
  double total = 0;
  for (int c = 0; c < channels_; ++c) {
    if (r[c] <= 0) return;  // a channel carried nothing this step: no information, keep weights
    total += r[c];
  }
  double sum = 0;
  for (int c = 0; c < channels_; ++c) {
    double& w = weights_[static_cast<size_t>(c)];
    w = (1 - opt_.balance_alpha) * w + opt_.balance_alpha * (r[c] / total);
    w = std::max(w, 0.02);  // never starve a channel entirely: keep measuring it
    sum += w;
  }
  for (double& w : weights_) w /= sum;
}

// Coordinator: rank 0 gathers every rank's readiness bitmask (an allgather stands in for the
// gather), combines them and broadcasts the decision: two dependent round trips per step.
at::Tensor DataParallel::centralReadiness() {
  const int64_t P = static_cast<int64_t>(params_.size());
  at::Tensor mine = at::empty({P}, at::kByte);
  for (int64_t i = 0; i < P; ++i) mine.data_ptr<uint8_t>()[i] = params_[static_cast<size_t>(i)].grad().defined();
  at::Tensor all = at::empty({world_.world, P}, at::kByte);
  transport_->allgather(mine, all, opt_.channel)->wait();
  at::Tensor decision = world_.rank == 0 ? std::get<0>(all.max(0)).contiguous() : at::empty({P}, at::kByte);
  transport_->broadcast(decision, 0, opt_.channel)->wait();
  return decision;
}

bool DataParallel::finishBackward() {
  if (!sync_) return true;
  const at::Tensor decided = opt_.negotiation == Negotiation::kCentral ? centralReadiness() : at::Tensor();
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Buckets with parameters that got no gradient this step are launched now, still in order.
    while (next_launch_ < pending_.size()) launch(next_launch_++);
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& w : works_) w->wait();
  const double exposed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  exposed_s_ += exposed;
  works_.clear();
  if (opt_.transfer != TransferDtype::kFloat32 && !direct_ && !afterUnscale(unscale())) {
    last_finish_ = std::chrono::steady_clock::now();
    return false;
  }
  // Which parameters got a gradient anywhere: one bitwise-or allreduce, no coordinator.
  at::Tensor anywhere = decided;
  if (opt_.detect_unused && !anywhere.defined() && flags_at_ >= 0) {
    const at::Tensor& reduced = opt_.transfer == TransferDtype::kFloat32 ? buffers_.back() : wire_.back();
    anywhere = reduced.narrow(0, flags_at_, static_cast<int64_t>(params_.size())).gt(0).to(at::kByte).cpu().contiguous();
  } else if (opt_.detect_unused && !anywhere.defined()) {
    anywhere = at::from_blob(had_grad_.data(), {static_cast<int64_t>(had_grad_.size())}, at::kByte).clone();
    transport_->allreduce(anywhere, ReduceOp::kBitwiseOr, opt_.channel)->wait();
  }
  at::NoGradGuard no_grad;
  bool finite = true;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (anywhere.defined() && anywhere.data_ptr<uint8_t>()[i] == 0) continue;
    if (direct_) {
      finite &= unscaleInto(i);
      continue;
    }
    at::Tensor avg = buffers_[bucket_of_[i]].narrow(0, offset_of_[i], params_[i].numel()).view_as(params_[i]);
    if (params_[i].grad().defined()) {
      params_[i].mutable_grad().copy_(avg);
    } else {
      params_[i].mutable_grad() = avg.clone();
    }
  }
  if (direct_ && !afterUnscale(finite)) {
    last_finish_ = std::chrono::steady_clock::now();
    return false;
  }
  rebalanceChannels();
  const bool rebuild = steps_ == 0 && opt_.rebuild_after_first_step;
  ++steps_;
  if (rebuild) {
    rebuildFromArrivalOrder();
  } else {
    resetStep();
  }
  if (tuner_ && !tuner_->frozen() && steps_ >= 2) tune(exposed);  // step 1 paid for the rebuild
  last_finish_ = std::chrono::steady_clock::now();
  return true;
}

// The step's time (end of the previous finishBackward to now) and exposed wait, averaged over
// ranks with one allreduce: every rank feeds the tuner the same numbers.
void DataParallel::tune(double exposed_this_step) {
  const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_finish_).count();
  at::Tensor m = at::tensor({step_s, exposed_this_step}, at::kDouble);
  transport_->allreduce(m, ReduceOp::kSum, opt_.channel)->wait();
  const double* v = m.data_ptr<double>();
  const TuneConfig before = tuner_->current();
  const bool changed = tuner_->record(v[0] / world_.world, v[1] / world_.world);
  if (changed) apply(tuner_->current());
  if (opt_.timeline && (changed || tuner_->frozen())) {
    opt_.timeline->instant(strCat("autotune: ", tuner_->frozen() ? "chose " : "try ",
                                  tuner_->current().str(opt_.two_level != nullptr)), 0);
  }
  if (tuner_->frozen() && world_.rank == 0) std::cerr << "autotune: " << tuner_->summary() << "\n";
  (void)before;
}

// Switches fusion cap, channel count and transport; every rank does the same between steps.
void DataParallel::apply(const TuneConfig& c) {
  std::shared_ptr<Transport> want = c.two_level && opt_.two_level ? opt_.two_level : flat_;
  const bool new_transport = want != transport_;
  transport_ = want;
  const int k = std::max(1, std::min(c.channels, transport_->channels()));
  if (new_transport || k != channels_) {
    channels_ = k;
    weights_.assign(static_cast<size_t>(channels_), 1.0 / channels_);
    last_stats_.clear();
    for (int ch = 0; ch < channels_; ++ch) last_stats_.push_back(transport_->channelStats(ch));
  }
  if (c.bucket_mb != opt_.bucket_mb) {
    opt_.bucket_mb = c.bucket_mb;
    const auto mb = [](double m) { return std::max<int64_t>(1, static_cast<int64_t>(m * 1024 * 1024)); };
    std::lock_guard<std::mutex> lock(mu_);
    plan_ = planBuckets(infos_, order_, mb(opt_.first_bucket_mb), mb(opt_.bucket_mb));
    buildBuckets(plan_);
  }
}

// Rank 0's arrival order (parameters that never arrived go last, in reverse registration order)
// is broadcast, and every rank rebuilds the same plan from it.
void DataParallel::rebuildFromArrivalOrder() {
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
  transport_->broadcast(t, 0, opt_.channel)->wait();
  std::vector<size_t> agreed(params_.size());
  for (size_t k = 0; k < agreed.size(); ++k) agreed[k] = static_cast<size_t>(t[static_cast<int64_t>(k)].item<int64_t>());
  order_ = agreed;
  const auto mb = [](double m) { return std::max<int64_t>(1, static_cast<int64_t>(m * 1024 * 1024)); };
  plan_ = planBuckets(infos_, agreed, mb(opt_.first_bucket_mb), mb(opt_.bucket_mb));
  buildBuckets(plan_);
  std::fill(ready_.begin(), ready_.end(), 0);
  arrival_.clear();
}

// fp16/bf16 transfer on the GPU (CPU goes straight into .grad through unscaleInto): the buckets
// back to fp32 and unscaled on the device, one flag read per bucket. Every rank holds the same
// reduced values, so every rank reaches the same verdict on overflow without exchanging a word.
// Returns false when any value is inf or nan.
bool DataParallel::unscale() {
  bool finite = true;
  const auto s = static_cast<float>(1.0 / scale_);
  for (size_t b = 0; b < buffers_.size(); ++b) {
    buffers_[b].copy_(wire_[b]).mul_(s);
    finite &= at::isfinite(wire_[b]).all().item<bool>();
  }
  return finite;
}

// Parameter i's reduced gradient, from the wire buffer into its .grad, unscaled (allocated when
// this rank had none). Returns false when any value is inf or nan.
bool DataParallel::unscaleInto(size_t i) {
  const auto* src = static_cast<const uint16_t*>(wire_[bucket_of_[i]].data_ptr()) + offset_of_[i];
  const auto n = static_cast<size_t>(params_[i].numel());
  const auto s = static_cast<float>(1.0 / scale_);
  at::Tensor& g = params_[i].mutable_grad();
  if (!g.defined()) g = at::empty(params_[i].sizes(), params_[i].options());
  at::Tensor out = g.is_contiguous() ? g : at::empty(g.sizes(), g.options());
  const bool finite = opt_.transfer == TransferDtype::kFloat16 ? halfToFloat(src, out.data_ptr<float>(), n, s)
                                                               : bf16ToFloat(src, out.data_ptr<float>(), n, s);
  if (!out.is_same(g)) g.copy_(out);
  return finite;
}

// After a reduce in fp16/bf16: on overflow the step is skipped everywhere and the fp16 scale
// halves; after scale_growth_steps clean steps it doubles. Returns `finite`.
bool DataParallel::afterUnscale(bool finite) {
  if (!finite) {
    if (opt_.transfer == TransferDtype::kFloat16) scale_ /= 2;
    clean_steps_ = 0;
    ++skipped_;
    resetStep();
    return false;
  }
  if (opt_.transfer == TransferDtype::kFloat16 && ++clean_steps_ >= opt_.scale_growth_steps) {
    scale_ *= 2;
    clean_steps_ = 0;
  }
  return true;
}

void DataParallel::resetStep() {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t b = 0; b < plan_.buckets.size(); ++b) pending_[b] = static_cast<int>(plan_.buckets[b].size());
  std::fill(ready_.begin(), ready_.end(), 0);
  next_launch_ = 0;
  arrival_.clear();
}

std::string DataParallel::describe() const {
  const std::string tuned = tuner_ ? strCat("; autotune ", tuner_->summary()) : std::string();
  const char* dtype = opt_.transfer == TransferDtype::kFloat16 ? "fp16" : opt_.transfer == TransferDtype::kBFloat16 ? "bf16" : "fp32";
  return strCat(transport_->describe(), "; ", dtype,
                " transfer; ", plan_.buckets.size(), " buckets (cap ", opt_.bucket_mb, " MiB) over ",
                channels_, channels_ == 1 ? " channel" : " channels", tuned);
}

void DataParallel::allreduceSum(at::Tensor& t) {
  at::Tensor c = t.contiguous();
  transport_->allreduce(c, ReduceOp::kSum, opt_.channel)->wait();
  if (!c.is_same(t)) t.copy_(c);
}

}  // namespace aiacc::comm
