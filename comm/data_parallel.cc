#include "aiacc/comm/data_parallel.h"

namespace aiacc::comm {
namespace {

StripingOptions stripingOptions(const DataParallelOptions& o) {
  StripingOptions s;
  s.channels = o.channels;
  s.balance = o.balance_channels;
  s.balance_alpha = o.balance_alpha;
  s.min_split_bytes = o.min_split_bytes;
  return s;
}

ReducerOptions reducerOptions(const DataParallelOptions& o) {
  ReducerOptions r;
  r.bucket_mb = o.bucket_mb;
  r.first_bucket_mb = o.first_bucket_mb;
  r.detect_unused = o.detect_unused;
  r.rebuild_after_first_step = o.rebuild_after_first_step;
  r.timeline = o.timeline;
  r.clock = o.clock;
  return r;
}

CodecOptions codecOptions(const DataParallelOptions& o) {
  CodecOptions c;
  c.dtype = o.transfer;
  c.grad_scale = o.grad_scale;
  c.scale_growth_steps = o.scale_growth_steps;
  return c;
}

std::shared_ptr<torch::nn::Module> requireModule(std::shared_ptr<torch::nn::Module> m) {
  AIACC_CHECK_INPUT(m != nullptr, "DataParallel: the model is null");
  return m;
}

}  // namespace

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<Transport> transport,
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
  flat_ = std::make_shared<StripedTransport>(transport, stripingOptions(opt_));
  striped_ = flat_;
  codec_ = makeCodec(codecOptions(opt_));
  reducer_ = std::make_unique<Reducer>(module_, striped_, striped_->inner(), codec_, world_, reducerOptions(opt_));
  broadcastModuleState(*module_, control(), /*parameters=*/true, /*buffers=*/true);
  if (opt_.autotune && world_.world > 1) {
    AIACC_CHECK(!opt_.two_level || (opt_.two_level->size() == world_.world && opt_.two_level->rank() == world_.rank),
                "DataParallel: the two-level transport spans other ranks");
    if (opt_.two_level) two_level_ = std::make_shared<StripedTransport>(opt_.two_level, stripingOptions(opt_));
    TuneSpace space = opt_.tune_space;
    space.try_two_level = space.try_two_level && two_level_ != nullptr;
    for (int& k : space.channels) k = std::min(k, transport->channels());
    // Two-level first where it is available: between nodes it sends 1/ranks-per-node of the
    // flat ring's bytes over the network and, on hosts whose cores are all busy, leaves them
    // less TCP work; flat must then beat it by more than noise. (Starting flat, a tie within
    // the lab's step-to-step noise kept flat, 5-10% slower there: 85-90 against 93-98 images/s.)
    tuner_ = std::make_unique<Autotuner>(TuneConfig{opt_.bucket_mb, striped_->activeChannels(), space.try_two_level},
                                         space);
    apply(tuner_->current());
  }
  last_finish_ = now();
  const auto params = module_->parameters();
  vote_ = at::zeros({1}, at::TensorOptions().dtype(at::kByte).device(params.empty() ? at::Device(at::kCPU)
                                                                                    : params.front().device()));
}

DataParallel::~DataParallel() {
  // The last vote is still in flight: its buffer must outlive it. Its error, if any, was or will be met by the caller's
  // other collectives.
  if (pending_vote_) {
    try {
      pending_vote_->synchronize();
    } catch (const std::exception&) {
    }
  }
}

double DataParallel::now() const { return opt_.clock(); }

template <typename F>
auto DataParallel::abortOnFailure(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const CommError& e) {
    const std::string why = abortReason(e);
    flat_->abort(why);
    if (two_level_) two_level_->abort(why);
    throw;
  }
}

void DataParallel::beforeForward() {
  abortOnFailure([&] { buffers_.beforeForward(control()); });
}

void DataParallel::syncBuffers() {
  abortOnFailure([&] {
    buffers_.beforeRead(control());
    synchronizeTransports();
  });
}

void DataParallel::synchronize() {
  abortOnFailure([&] { synchronizeTransports(); });
}

void DataParallel::synchronizeTransports() {
  flat_->synchronize();
  if (two_level_) two_level_->synchronize();
}

bool DataParallel::finishBackward() {
  return abortOnFailure([&] { return finishBackwardImpl(); });
}

bool DataParallel::finishBackwardImpl() {
  if (!reducer_->syncing()) return true;
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

// The step's time (end of the previous finishBackward to now) and exposed wait, averaged over
// ranks with one allreduce: every rank feeds the tuner the same numbers.
void DataParallel::tune(double exposed_this_step) {
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
void DataParallel::apply(const TuneConfig& c) {
  const std::shared_ptr<StripedTransport> want = c.two_level && two_level_ ? two_level_ : flat_;
  const bool new_transport = want != striped_;
  striped_ = want;
  const int k = std::max(1, std::min(c.channels, striped_->channels()));
  if (new_transport || k != striped_->activeChannels()) striped_->setActiveChannels(k);
  if (new_transport) reducer_->setTransports(striped_, striped_->inner());
  reducer_->setBucketCap(c.bucket_mb);
}

CommState DataParallel::commState() const {
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
std::vector<std::string> DataParallel::restoreCommState(const CommState& state) {
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

std::string DataParallel::describe() const {
  const std::string tuned = tuner_ ? strCat("; autotune ", tuner_->summary()) : std::string();
  const int k = striped_->activeChannels();
  return strCat(striped_->describe(), "; ", transferDtypeName(codec_->dtype()), " transfer; ", plan().buckets.size(),
                " buckets (cap ", reducer_->bucketCap(), " MiB) over ", k, k == 1 ? " channel" : " channels", tuned);
}

uint8_t DataParallel::voteFlags(uint8_t mine) {
  return abortOnFailure([&] {
    uint8_t agreed = 0;
    if (pending_vote_) {
      pending_vote_->synchronize();  // submitted a step ago, behind that step's buckets: done by now
      agreed = vote_.item<uint8_t>();
    }
    vote_.fill_(mine);
    pending_vote_ = control().allreduce(vote_, ReduceOp::kBitwiseOr, 0);
    return agreed;
  });
}

void DataParallel::allreduceSum(at::Tensor& t) {
  at::Tensor c = t.contiguous();
  abortOnFailure([&] { control().allreduce(c, ReduceOp::kSum, 0)->wait(); });
  if (!c.is_same(t)) t.copy_(c);
}

}  // namespace aiacc::comm
