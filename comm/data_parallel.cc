#include "aiacc/comm/data_parallel.h"

#include <chrono>
#include <cstring>
#include <optional>

#include <torch/csrc/autograd/engine.h>

#include <atomic>

#include "aiacc/comm/agreement.h"
#include "aiacc/comm/autotune.h"
#include "aiacc/comm/bucket_codec.h"
#include "aiacc/comm/buffer_sync.h"
#include "aiacc/comm/process_group.h"
#include "aiacc/comm/reducer.h"
#include "aiacc/comm/striped_transport.h"

namespace aiacc::comm {
namespace {

std::shared_ptr<torch::nn::Module> requireModule(std::shared_ptr<torch::nn::Module> m) {
  AIACC_CHECK_INPUT(m != nullptr, "DataParallel: the model is null");
  return m;
}

// Every rank's options against rank 0's, over the transport (two allgathers: the lengths, then the
// settings padded to the longest): InputError on every rank naming the first rank and option that
// differ. Before anything else is exchanged, so that ranks set up differently stop here, and not
// in a bucket plan or a collective of another size.
void agreeOnOptions(Transport& t, const WorldInfo& world, const Settings& mine) {
  if (world.world == 1) return;
  const std::string bytes = encodeSettings(mine);
  at::Tensor len = at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong);
  at::Tensor lens = at::empty({world.world}, at::kLong);
  t.allgather(len, lens, 0)->wait();
  const int64_t longest = lens.max().item<int64_t>();
  at::Tensor padded = at::zeros({longest}, at::kByte);
  std::memcpy(padded.data_ptr(), bytes.data(), bytes.size());
  at::Tensor all = at::empty({world.world * longest}, at::kByte);
  t.allgather(padded, all, 0)->wait();
  auto settingsOf = [&](int r) {
    const char* p = reinterpret_cast<const char*>(all.data_ptr<uint8_t>()) + r * longest;
    return decodeSettings(std::string(p, static_cast<size_t>(lens[r].item<int64_t>())));
  };
  const Settings first = settingsOf(0);
  for (int r = 1; r < world.world; ++r) {
    const std::string diff = firstDifference(settingsOf(r), r, first, 0);
    AIACC_CHECK_INPUT(diff.empty(), "DataParallel: the ranks were given different options: ", diff,
                      " (DataParallelOptions, or the AIACC_* variables that set them, must be the same on every rank)");
  }
}

}  // namespace

struct DataParallel::Impl {
  Impl(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<Transport> transport, const WorldInfo& world,
       const DataParallelOptions& options);
  ~Impl();
  Transport& control() const { return *striped_->inner(); }
  // Runs f; a CommError aborts every transport, then propagates.
  template <typename F>
  auto abortOnFailure(F&& f) -> decltype(f());
  bool finishBackward();
  // finishBackward() with its CommError aborting the transports; the result kept (last_ok_).
  bool finishAndRecord();
  // options.finish_in_backward: at each gradient hook; the first of a backward queues
  // finishInBackward, which autograd runs as backward() ends.
  void onGradient();
  void finishInBackward();
  void synchronizeTransports();
  void tune(double exposed_this_step);
  void apply(const TuneConfig& c);
  double now() const { return opt_.clock(); }
  CommState commState() const;
  std::vector<std::string> restoreCommState(const CommState& state);
  std::string describe() const;
  uint8_t voteFlags(uint8_t mine);
  void sendStagedVote();
  bool tuning() const { return tuner_ && !tuner_->frozen(); }

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
  // finish_in_backward: whether this backward's callback is queued, whether it finished the
  // step (finishBackward() then only reports), and the last finished step's result.
  std::atomic<bool> queued_{false};
  std::atomic<bool> finished_{false};
  std::atomic<bool> last_ok_{true};
  // The stop vote (voteFlags): the flags of the last call, sent behind the next step's last
  // gradient bucket (or by the next call, if no step came between); the one in flight, on the
  // parameters' device (destruction waits for it).
  std::optional<uint8_t> staged_vote_;
  at::Tensor vote_;
  std::shared_ptr<Work> pending_vote_;
};

DataParallel::Impl::Impl(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<Transport> transport,
                         const WorldInfo& world, const DataParallelOptions& options)
    : module_(requireModule(std::move(module))), world_(world), opt_(options),
      buffers_(module_, options.buffers, world.world) {
  AIACC_CHECK_INPUT(transport != nullptr,
                    "DataParallel: the transport is null: make the process group first (comm::initProcessGroup) and "
                    "pass its transports.primary");
  AIACC_CHECK_INPUT(transport->size() == world_.world && transport->rank() == world_.rank,
                    "DataParallel: the transport is rank ", transport->rank(), " of ", transport->size(),
                    ", the world given says ", world_.rank, " of ", world_.world, ": pass the process group's world");
  if (!opt_.clock) {
    opt_.clock = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    };
  }
  agreeOnOptions(*transport, world_, optionSettings(opt_));  // first: every rank refuses alike after it
  AIACC_CHECK_INPUT(opt_.reducer.launch_in_backward,
                    "DataParallel: reducer.launch_in_backward must be on (off is a central coordinator's Reducer)");
  flat_ = std::make_shared<StripedTransport>(transport, opt_.striping);
  striped_ = flat_;
  codec_ = makeCodec(opt_.codec);
  reducer_ = std::make_unique<Reducer>(module_, striped_, striped_->inner(), codec_, world_, opt_.reducer,
                                       opt_.timeline, opt_.clock);
  if (opt_.finish_in_backward) reducer_->setOnGradient([this] { onGradient(); });
  broadcastModuleState(*module_, control(), opt_.broadcast_parameters, /*buffers=*/true);
  if (opt_.autotune && world_.world > 1) {
    AIACC_CHECK(!opt_.two_level || (opt_.two_level->size() == world_.world && opt_.two_level->rank() == world_.rank),
                "DataParallel: the two-level transport spans other ranks");
    if (opt_.two_level) two_level_ = std::make_shared<StripedTransport>(opt_.two_level, opt_.striping);
    TuneSpace space = opt_.tune;
    space.try_two_level = space.try_two_level && two_level_ != nullptr;
    for (int& k : space.channels) k = std::min(k, transport->channels());
    // Two-level first where it is available: between nodes it sends 1/ranks-per-node of the
    // flat ring's bytes over the network and, on hosts whose cores are all busy, leaves them
    // less TCP work; flat must then beat it by more than noise. (Starting flat, a tie within
    // the lab's step-to-step noise kept flat, 5-10% slower there: 85-90 against 93-98 images/s.)
    tuner_ = std::make_unique<Autotuner>(TuneConfig{opt_.reducer.bucket_mb, striped_->activeChannels(),
                                                    space.try_two_level},
                                         space);
    apply(tuner_->current());
  }
  last_finish_ = now();
  const auto params = module_->parameters();
  vote_ = at::zeros({1}, at::TensorOptions().dtype(at::kByte).device(params.empty() ? at::Device(at::kCPU)
                                                                                    : params.front().device()));
}

DataParallel::Impl::~Impl() {
  // The last vote is still in flight: its buffer must outlive it. Its error, if any, was or will be met by the caller's
  // other collectives.
  if (pending_vote_) {
    try {
      pending_vote_->synchronize();
    } catch (const std::exception&) {
    }
  }
}

template <typename F>
auto DataParallel::Impl::abortOnFailure(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const CommError& e) {
    const std::string why = abortReason(e);
    flat_->abort(why);
    if (two_level_) two_level_->abort(why);
    throw;
  }
}

void DataParallel::Impl::synchronizeTransports() {
  flat_->synchronize();
  if (two_level_) two_level_->synchronize();
}

bool DataParallel::Impl::finishBackward() {
  buffers_.markChanged();
  if (!reducer_->syncing()) return true;
  // The vote goes right behind the step's last bucket: every rank meets it there, in step, while
  // this thread waits for the gradients, so it costs no wake-up or wait of its own.
  reducer_->launchRemaining();
  sendStagedVote();
  if (!reducer_->finish()) {
    last_finish_ = now();
    return false;
  }
  striped_->rebalance();
  ++steps_;
  if (tuner_ && !tuner_->frozen() && steps_ >= 2) tune(reducer_->lastExposedSeconds());  // step 1 paid for the rebuild
  last_finish_ = now();
  return true;
}

void DataParallel::Impl::onGradient() {
  if (queued_.exchange(true)) return;
  finished_ = false;
  // Runs on the thread that ends the backward pass (DDP's finalize_backward is queued alike); what
  // it throws, backward() throws.
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finishInBackward(); });
}

bool DataParallel::Impl::finishAndRecord() {
  const bool ok = abortOnFailure([&] { return finishBackward(); });
  last_ok_ = ok;
  return ok;
}

void DataParallel::Impl::finishInBackward() {
  queued_ = false;
  if (!finishAndRecord()) {  // every rank skips: no gradient, so the optimizer's step() leaves each parameter alone
    for (at::Tensor& p : module_->parameters()) p.mutable_grad().reset();
  }
  finished_ = true;
}

// The step's time (end of the previous finishBackward to now) and exposed wait, averaged over
// ranks with one allreduce: every rank feeds the tuner the same numbers.
void DataParallel::Impl::tune(double exposed_this_step) {
  const double step_s = now() - last_finish_;
  at::Tensor m = at::tensor({step_s, exposed_this_step}, at::kDouble);
  control().allreduce(m, ReduceOp::kSum, 0)->wait();
  const double* v = m.data_ptr<double>();
  const bool changed = tuner_->record(v[0] / world_.world, v[1] / world_.world);
  if (changed) apply(tuner_->current());
  if (opt_.timeline && (changed || tuner_->frozen())) {
    opt_.timeline->instant(strCat("autotune: ", tuner_->frozen() ? "chose " : "try ",
                                  tuner_->current().str(two_level_ != nullptr)),
                           0);
  }
  if (tuner_->frozen() && opt_.log) opt_.log("autotune: " + tuner_->summary());
}

// Switches fusion cap, channel count and transport; every rank does the same between steps.
void DataParallel::Impl::apply(const TuneConfig& c) {
  const std::shared_ptr<StripedTransport> want = c.two_level && two_level_ ? two_level_ : flat_;
  const bool new_transport = want != striped_;
  striped_ = want;
  const int k = std::max(1, std::min(c.channels, striped_->channels()));
  if (new_transport || k != striped_->activeChannels()) striped_->setActiveChannels(k);
  if (new_transport) reducer_->setTransports(striped_, striped_->inner());
  reducer_->setBucketCap(c.bucket_mb);
}

CommState DataParallel::Impl::commState() const {
  CommState s;
  if (const GradScale* g = codec_->ownScale()) {
    s.transfer_scale = g->value();
    s.transfer_good_steps = g->goodSteps();
  }
  if (tuner_ && tuner_->frozen()) s.tuned = tuner_->current();
  // Shares measured while still tuning belong to a trial: a set-up restored from them tunes again.
  if (striped_->activeChannels() > 1 && !tuning()) s.channel_weights = striped_->weights();
  s.bucket_order = reducer_->rebuiltOrder();
  return s;
}

// Each part applied where this set-up can use it, in the order the uninterrupted set-up reached
// it: the tuner's choice (which resets the channel shares), then the shares, then the order.
std::vector<std::string> DataParallel::Impl::restoreCommState(const CommState& state) {
  checkCommState(state, reducer_->params().size());
  std::vector<std::string> unused;
  if (GradScale* g = codec_->ownScale()) {
    // A state without a scale (written by a set-up without one): this one keeps its initial scale.
    if (state.transfer_scale != 0) g->setState(state.transfer_scale, state.transfer_good_steps);
  } else if (state.transfer_scale != 0) {
    unused.push_back(strCat("the transfer scale (", state.transfer_scale,
                            ") is not used: this set-up's transfer has no scale of its own"));
  }
  if (state.tuned) {
    const TuneConfig& c = *state.tuned;
    std::string why;
    if (!tuner_) {
      why = "this set-up does not tune";
    } else if (c.two_level && !two_level_) {
      why = "this set-up has no two-level reduction";
    } else if (c.channels > (c.two_level ? two_level_ : flat_)->channels()) {
      why = strCat("its transport has ", (c.two_level ? two_level_ : flat_)->channels(), " channels");
    }
    if (why.empty()) {
      tuner_->restoreFrozen(c);
      apply(c);
      if (opt_.log) opt_.log("autotune: " + tuner_->summary());
    } else {
      unused.push_back(strCat("the tuner's choice (", c.str(), ") is not used: ", why));
    }
  }
  if (!state.channel_weights.empty()) {
    if (static_cast<int>(state.channel_weights.size()) == striped_->activeChannels()) {
      striped_->setWeights(state.channel_weights);
    } else {
      unused.push_back(strCat("the channel shares (", state.channel_weights.size(),
                              " channels) are not used: ", "this set-up splits over ", striped_->activeChannels()));
    }
  }
  if (!state.bucket_order.empty()) reducer_->restoreOrder(state.bucket_order);
  return unused;
}

std::string DataParallel::Impl::describe() const {
  const std::string tuned = tuner_ ? strCat("; autotune ", tuner_->summary()) : std::string();
  const int k = striped_->activeChannels();
  const std::string transfer = opt_.reducer.hook ? strCat("comm hook ", opt_.reducer.hook->name())
                                                 : strCat(transferDtypeName(codec_->dtype()), " transfer");
  return strCat(striped_->describe(), "; ", transfer, "; ", reducer_->plan().buckets.size(), " buckets (cap ",
                reducer_->bucketCap(), " MiB) over ", k, k == 1 ? " channel" : " channels", tuned);
}

void DataParallel::Impl::sendStagedVote() {
  if (!staged_vote_) return;
  vote_.fill_(*staged_vote_);
  staged_vote_.reset();
  pending_vote_ = control().allreduce(vote_, ReduceOp::kBitwiseOr, 0);
}

uint8_t DataParallel::Impl::voteFlags(uint8_t mine) {
  return abortOnFailure([&] {
    sendStagedVote();  // no step since the last call: its flags go now (and are waited for below)
    uint8_t agreed = 0;
    if (pending_vote_) {
      pending_vote_->synchronize();  // sent behind this step's buckets, which finishBackward waited for
      agreed = vote_.item<uint8_t>();
      pending_vote_.reset();
    }
    staged_vote_ = mine;
    return agreed;
  });
}

namespace {
DataParallelOptions withTwoLevel(DataParallelOptions o, const ProcessGroup& group) {
  if (!o.two_level) o.two_level = group.transports.alternative;
  return o;
}
}  // namespace

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module> module, const ProcessGroup& group,
                           const DataParallelOptions& options)
    : DataParallel(std::move(module), group.transports.primary, group.world, withTwoLevel(options, group)) {}

// Not owned: an aliasing pointer with no owner (the caller's object, which outlives this).
DataParallel::DataParallel(torch::nn::Module& module, const ProcessGroup& group, const DataParallelOptions& options)
    : DataParallel(std::shared_ptr<torch::nn::Module>(std::shared_ptr<torch::nn::Module>(), &module), group, options) {}

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<Transport> transport,
                           const WorldInfo& world, const DataParallelOptions& options)
    : impl_(std::make_unique<Impl>(std::move(module), std::move(transport), world, options)) {}

DataParallel::~DataParallel() = default;

const WorldInfo& DataParallel::world() const { return impl_->world_; }

void DataParallel::beforeForward() {
  impl_->abortOnFailure([&] { impl_->buffers_.beforeForward(impl_->control()); });
}

void DataParallel::syncBuffers() {
  impl_->abortOnFailure([&] {
    impl_->buffers_.beforeRead(impl_->control());
    impl_->synchronizeTransports();
  });
}

void DataParallel::synchronize() {
  impl_->abortOnFailure([&] { impl_->synchronizeTransports(); });
}

bool DataParallel::finishBackward() {
  if (impl_->finished_.exchange(false)) return impl_->last_ok_;  // backward() finished the step
  impl_->queued_ = false;  // (a backward that failed before its end never ran its callback)
  return impl_->finishAndRecord();
}

bool DataParallel::lastStepSkipped() const { return !impl_->last_ok_; }

void DataParallel::allreduceSum(at::Tensor& t) {
  at::Tensor c = t.contiguous();
  impl_->abortOnFailure([&] { impl_->control().allreduce(c, ReduceOp::kSum, 0)->wait(); });
  if (!c.is_same(t)) t.copy_(c);
}

void DataParallel::broadcast(at::Tensor& t, int root) {
  at::Tensor c = t.contiguous();
  impl_->abortOnFailure([&] { impl_->control().broadcast(c, root, 0)->wait(); });
  if (!c.is_same(t)) t.copy_(c);
}

double DataParallel::exposedCommSeconds() const { return impl_->reducer_->exposedSeconds(); }
std::string DataParallel::describe() const { return impl_->describe(); }
bool DataParallel::tuning() const { return impl_->tuning(); }
bool DataParallel::shareLossScale(std::shared_ptr<GradScale> scale) {
  return impl_->codec_->shareScale(std::move(scale));
}
CommState DataParallel::commState() const { return impl_->commState(); }
std::vector<std::string> DataParallel::restoreCommState(const CommState& state) {
  return impl_->restoreCommState(state);
}
uint8_t DataParallel::voteFlags(uint8_t mine) { return impl_->voteFlags(mine); }
const Autotuner* DataParallel::tuner() const { return impl_->tuner_.get(); }
void DataParallel::setSync(bool on) { impl_->reducer_->setSync(on); }
const BucketPlan& DataParallel::plan() const { return impl_->reducer_->plan(); }
const std::vector<double>& DataParallel::channelWeights() const { return impl_->striped_->weights(); }
double DataParallel::gradScale() const { return impl_->codec_->scale(); }
int64_t DataParallel::skippedSteps() const {
  return impl_->codec_->skippedSteps() + impl_->reducer_->hookSkippedSteps();
}
const std::vector<ParamInfo>& DataParallel::params() const { return impl_->reducer_->params(); }

}  // namespace aiacc::comm
