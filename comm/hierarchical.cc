#include "aiacc/comm/hierarchical.h"
#include "aiacc/config.h"

#include "aiacc/comm/failure.h"
#include "aiacc/comm/shm_transport.h"

namespace aiacc::comm {

// One operation moving through the three stages.
struct HierarchicalTransport::Op {
  Stage s2, s3;
  std::shared_ptr<Work> w1, w2, w3;
  // Ends when w3 is set (or null: nothing left) or on an error, held as a value, not as the
  // relay's exception object (failure.h). w3 is written before it ends, read after its wait().
  Completion end;

  void finish(std::shared_ptr<Work> last, Failure f) {
    w3 = std::move(last);
    end.finish(std::move(f));
  }
};

namespace {
class OpWork : public Work {
 public:
  using Waiter = std::function<void()>;
  OpWork(Waiter w, std::function<Failure()> failure) : wait_(std::move(w)), failure_(std::move(failure)) {}
  void wait() override {
    if (wait_) {
      Waiter w = std::move(wait_);
      wait_ = nullptr;
      w();
    }
  }
  Failure failure() const override { return failure_(); }

 private:
  Waiter wait_;
  std::function<Failure()> failure_;
};

// The last stage of a chain submitted by the caller: waiting for it waits for all (and raises
// its error again on every wait).
// synchronize() blocks for every stage: each ran on its own communicator, whose failure the last
// stage's completion does not show.
class ChainWork : public Work {
 public:
  explicit ChainWork(std::vector<std::shared_ptr<Work>> stages) : stages_(std::move(stages)) {}
  void wait() override {
    if (!stages_.empty()) stages_.back()->wait();
  }
  void synchronize() override {
    for (auto& w : stages_) w->synchronize();
  }
  Failure failure() const override { return firstFailure(stages_); }

 private:
  std::vector<std::shared_ptr<Work>> stages_;
};
}  // namespace

HierarchicalTransport::HierarchicalTransport(std::shared_ptr<Transport> intra, std::shared_ptr<Transport> inter,
                                             int64_t min_shard_bytes)
    : intra_(std::move(intra)), inter_(std::move(inter)), min_shard_bytes_(min_shard_bytes),
      device_ordered_(intra_->waitsOnDevice() && inter_->waitsOnDevice()) {
  const int K = inter_->channels();
  AIACC_CHECK(intra_->channels() == 2 * K, "hierarchical: the intra-node transport needs 2 x ", K, " channels, has ",
              intra_->channels());
  after1_.resize(static_cast<size_t>(K));
  after2_.resize(static_cast<size_t>(K));
  bytes_.assign(static_cast<size_t>(K), 0.0);
  for (int c = 0; c < K && !device_ordered_; ++c) {
    threads_.emplace_back([this, c] { relay(c, 1); });
    threads_.emplace_back([this, c] { relay(c, 2); });
  }
}

HierarchicalTransport::~HierarchicalTransport() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

std::string HierarchicalTransport::describe() const {
  return strCat("two-level, ", inter_->size(), " nodes x ", intra_->size(), " ranks (intra: ", intra_->describe(),
                "; inter: ", inter_->describe(), ")");
}

ChannelStats HierarchicalTransport::channelStats(int c) const {
  AIACC_CHECK(c >= 0 && c < channels(), "channel ", c, " of ", channels());
  ChannelStats s;
  s.busy_s = intra_->channelStats(2 * c).busy_s + intra_->channelStats(2 * c + 1).busy_s +
             inter_->channelStats(c).busy_s;
  std::lock_guard<std::mutex> lock(mu_);
  s.bytes = bytes_[static_cast<size_t>(c)];
  return s;
}

// Stage 1 is submitted here, in the caller's order; the relays submit stages 2 and 3 in the same
// order as their predecessors complete (FIFO), so every communicator sees the same sequence of
// operations on every rank. On device-ordered transports (NCCL) all three stages are submitted
// here, one after the other, each ordered after the previous one on the device: NCCL needs every
// rank to submit to its communicators in one and the same order, which relay threads, racing
// the caller's next submission, would not keep.
std::shared_ptr<Work> HierarchicalTransport::submit(int c, size_t bytes, Stage s1, Stage s2, Stage s3) {
  AIACC_CHECK(c >= 0 && c < channels(), "channel ", c, " of ", channels());
  if (device_ordered_) {
    std::lock_guard<std::mutex> lock(mu_);
    AIACC_CHECK(!stop_, "hierarchical transport is shutting down");
    bytes_[static_cast<size_t>(c)] += static_cast<double>(bytes);
    std::vector<std::shared_ptr<Work>> stages;
    try {
      for (Stage* s : {&s1, &s2, &s3}) {
        if (!*s) continue;
        if (!stages.empty()) stages.back()->wait();  // the device waits for the previous stage; the host goes on
        if (auto w = (*s)()) stages.push_back(std::move(w));
      }
    } catch (const std::exception& e) {
      abort(abortReason(e));
      throw;
    }
    return std::make_shared<ChainWork>(std::move(stages));
  }
  auto op = std::make_shared<Op>();
  op->s2 = std::move(s2);
  op->s3 = std::move(s3);
  {
    std::lock_guard<std::mutex> lock(mu_);  // stage-1 submission and queueing stay in one order
    AIACC_CHECK(!stop_, "hierarchical transport is shutting down");
    op->w1 = s1 ? s1() : nullptr;
    after1_[static_cast<size_t>(c)].push_back(op);
    bytes_[static_cast<size_t>(c)] += static_cast<double>(bytes);
  }
  cv_.notify_all();
  // Stage 3 is waited for here, by the caller: its failure aborts both levels too, before it is
  // raised, so operations queued behind it end at once (the levels outlive this transport).
  auto wait = [op, intra = intra_, inter = inter_] {
    if (Failure f = op->end.wait()) f.raise();
    if (!op->w3) return;
    try {
      op->w3->wait();
    } catch (const std::exception& e) {
      intra->abort(abortReason(e));
      inter->abort(abortReason(e));
      throw;
    }
  };
  auto failure = [op] {  // (w3 is written before `end` finishes: read only after)
    if (Failure f = op->end.peek()) return f;
    return op->end.finished() && op->w3 ? op->w3->failure() : Failure();
  };
  return std::make_shared<OpWork>(std::move(wait), std::move(failure));
}

void HierarchicalTransport::relay(int c, int stage) {
  auto& in = stage == 1 ? after1_[static_cast<size_t>(c)] : after2_[static_cast<size_t>(c)];
  for (;;) {
    std::shared_ptr<Op> op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !in.empty(); });
      if (in.empty()) return;
      op = in.front();
      in.pop_front();
    }
    try {
      auto& done = stage == 1 ? op->w1 : op->w2;
      if (done) done->wait();
      if (stage == 1) {
        op->w2 = op->s2 ? op->s2() : nullptr;
        op->s2 = nullptr;  // (its captures, the buffer among them, need not live as long as the Work)
        {
          std::lock_guard<std::mutex> lock(mu_);
          after2_[static_cast<size_t>(c)].push_back(op);
        }
        cv_.notify_all();
      } else {
        std::shared_ptr<Work> last = op->s3 ? op->s3() : nullptr;
        op->s3 = nullptr;
        op->finish(std::move(last), Failure());
      }
    } catch (const std::exception& e) {
      // Both levels are aborted before this relay waits for anything else: the stages queued
      // or running behind this one, on either level, then end at once instead of timing out.
      abort(abortReason(e));
      op->finish(nullptr, Failure::current());
    }
  }
}

std::shared_ptr<Work> HierarchicalTransport::allreduce(at::Tensor t, ReduceOp op, int c) {
  const int R = intra_->size();
  const int64_t n = t.numel();
  const bool sharded = op == ReduceOp::kSum && t.is_floating_point() && R > 1 &&
                       n / R * static_cast<int64_t>(t.element_size()) >= min_shard_bytes_;
  if (!sharded) {
    return submit(
        c, t.nbytes(), [this, t, op, c] { return intra_->allreduce(t, op, 2 * c); },
        [this, t, op, c] { return inter_->allreduce(t, op, c); }, nullptr);
  }
  const Shard mine = shardOf(n, R, intra_->rank());
  at::Tensor shard = t.narrow(0, mine.offset, mine.count);
  return submit(
      c, t.nbytes(), [this, t, c] { return intra_->reduceScatter(t, 2 * c); },
      [this, shard, c] { return inter_->allreduce(shard, ReduceOp::kSum, c); },
      [this, t, c] { return intra_->allgatherShards(t, 2 * c + 1); });
}

// Root's node first (between the ranks with root's local rank), then inside every node.
std::shared_ptr<Work> HierarchicalTransport::broadcast(at::Tensor t, int root, int c) {
  const int R = intra_->size();
  const int root_node = root / R, root_local = root % R;
  const bool on_root_line = intra_->rank() == root_local;
  return submit(
      c, t.nbytes(), nullptr,
      [this, t, c, on_root_line, root_node]() -> std::shared_ptr<Work> {
        return on_root_line ? inter_->broadcast(t, root_node, c) : nullptr;
      },
      [this, t, c, root_local] { return intra_->broadcast(t, root_local, 2 * c + 1); });
}

// Inside the node into the node's block of out (its ranks are consecutive), then the blocks
// between nodes.
std::shared_ptr<Work> HierarchicalTransport::allgather(at::Tensor in, at::Tensor out, int c) {
  const int R = intra_->size();
  const int64_t n = in.numel();
  AIACC_CHECK(out.numel() == n * size(), "allgather: out must hold ", size(), " x in");
  at::Tensor block = out.view(-1).narrow(0, inter_->rank() * R * n, R * n);
  return submit(
      c, out.nbytes(), [this, in, block, c] { return intra_->allgather(in.reshape(-1), block, 2 * c); },
      [this, block, out, c] { return inter_->allgather(block.clone(), out.view(-1), c); }, nullptr);
}

std::shared_ptr<Work> HierarchicalTransport::reduceScatter(at::Tensor t, int c) {
  return allreduce(t, ReduceOp::kSum, c);
}

// Every rank's shard, zeros elsewhere, summed.
std::shared_ptr<Work> HierarchicalTransport::allgatherShards(at::Tensor t, int c) {
  const Shard mine = shardOf(t.numel(), size(), rank());
  at::Tensor keep = t.narrow(0, mine.offset, mine.count).clone();
  t.zero_();
  t.narrow(0, mine.offset, mine.count).copy_(keep);
  return allreduce(t, ReduceOp::kSum, c);
}

#if AIACC_WITH_GLOO
std::shared_ptr<HierarchicalTransport> makeGlooHierarchical(c10::intrusive_ptr<c10d::Store> store,
                                                            const GlooOptions& base, int ranks_per_node,
                                                            int64_t min_shard_bytes, bool intra_shm) {
  const int R = ranks_per_node;
  AIACC_CHECK_INPUT(R >= 1 && base.world % R == 0,
                    "hierarchical reduction needs the same number of ranks "
                    "on every node: world ",
                    base.world, " is not a multiple of ", R, " ranks per node");
  const int node = base.rank / R, local = base.rank % R;
  GlooOptions intra = base, inter = base;
  intra.rank = local;
  intra.world = R;
  intra.channels = 2 * base.channels;
  intra.name = base.name + "/node" + std::to_string(node);
  intra.row_label = "intra";
  inter.rank = node;
  inter.world = base.world / R;
  inter.name = base.name + "/local" + std::to_string(local);
  inter.row_base = base.row_base + intra.channels;
  inter.row_label = "inter";
  std::shared_ptr<Transport> a;
  if (intra_shm) {
    ShmOptions so;
    so.rank = intra.rank;
    so.world = intra.world;
    so.channels = intra.channels;
    so.timeout = intra.timeout;
    so.name = intra.name;
    so.timeline = intra.timeline;
    so.row_base = intra.row_base;
    so.row_label = "intra (shm)";
    a = std::make_shared<ShmTransport>(store, so);
  } else {
    a = std::make_shared<GlooTransport>(store, intra);
  }
  auto b = std::make_shared<GlooTransport>(store, inter);
  return std::make_shared<HierarchicalTransport>(std::move(a), std::move(b), min_shard_bytes);
}
#endif

}  // namespace aiacc::comm
