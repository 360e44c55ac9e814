#include "aiacc/comm/gloo_transport.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>

#include "aiacc/comm/channel_worker.h"
#include "aiacc/comm/gloo_connect.h"
#include "aiacc/comm/gloo_pulse.h"
#include "aiacc/comm/half.h"
#include "aiacc/comm/reduce_ops.h"
#include "aiacc/comm/store.h"

namespace aiacc::comm {
// One Gloo context and the thread that runs its collectives, in submission order.
class GlooTransport::Channel {
 public:
  Channel(c10::intrusive_ptr<c10d::Store> store, const GlooOptions& o, int index)
      : index_(index), row_base_(o.row_base), timeline_(o.timeline), store_(store),
        addresses_(o.name + "/ch" + std::to_string(index) + "/address/") {
    if (timeline_) timeline_->nameRow(row(), o.row_label + " " + std::to_string(index));
    context_ = connectGloo(std::move(store), o.name + "/ch" + std::to_string(index) + "/", o.rank, o.world, o.bind_host,
                           o.timeout, "channel " + std::to_string(index));
    // This rank's address as its peers' Gloo errors print it ("[10.0.0.2]:41234"): read back only
    // when a collective fails, to name the peer (peerNamed).
    if (o.world > 1) {
      const std::string a = context_->getPair((o.rank + 1) % o.world)->address().str();
      store_->set(addresses_ + std::to_string(o.rank), std::vector<uint8_t>(a.begin(), a.end()));
    }
    worker_ = std::make_unique<ChannelWorker>(timeline_, row());
  }
  ~Channel() { worker_->shutdown(); }  // before the context goes

  ChannelStats stats() const { return worker_->stats(); }

  // Queued and later operations fail with `why`; so does the one in flight, at once, and the
  // peers' operations with this rank (interruptGloo).
  void abort(const std::string& why) {
    worker_->abort(why);
    if (!interrupted_.exchange(true)) interruptGloo(*context_);
  }

  std::shared_ptr<Work> submit(const char* what, std::function<void(const std::shared_ptr<gloo::Context>&)> fn,
                               size_t bytes = 0) {
    return worker_->submit(what, bytes, [this, fn = std::move(fn)] {
      try {
        fn(context_);
      } catch (const CommError&) {
        throw;
      } catch (const std::exception& e) {
        if (Failure f = worker_->firstError()) f.raise();  // abort() interrupted it: say why
        AIACC_THROW(CommError, "collective failed on rank ", context_->rank, ": ", peerNamed(firstLine(e.what())),
                    " (a peer died or timed out)");
      }
    });
  }

 private:
  int row() const { return 1 + row_base_ + index_; }
  // Gloo names a failed peer by its address: "... Read error [127.0.0.1]:37067: ..." becomes
  // "... Read error [127.0.0.1]:37067 (rank 1): ...", the ranks' addresses read from the store
  // (left as it is when the store is gone or no address matches).
  std::string peerNamed(const std::string& what) {
    try {
      for (int r = 0; r < context_->size; ++r) {
        const std::string key = addresses_ + std::to_string(r);
        if (r == context_->rank || !store_->check({key})) continue;
        const std::vector<uint8_t> v = store_->get(key);
        const std::string a(v.begin(), v.end());
        const size_t at = what.find(a);
        if (!a.empty() && at != std::string::npos) {
          return strCat(what.substr(0, at + a.size()), " (rank ", r, ")", what.substr(at + a.size()));
        }
      }
    } catch (const std::exception&) {  // the store is gone: Gloo's words alone
    }
    return what;
  }
  int index_;
  int row_base_;
  std::shared_ptr<Timeline> timeline_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::string addresses_;  // the store's key prefix of each rank's address
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::atomic<bool> interrupted_{false};
  std::unique_ptr<ChannelWorker> worker_;
};

void GlooTransport::abort(const std::string& why) {
  for (auto& ch : channels_) ch->abort(why);
}

GlooTransport::GlooTransport(c10::intrusive_ptr<c10d::Store> store, const GlooOptions& options)
    : opt_(options), store_(store) {
  AIACC_CHECK(opt_.world >= 1 && opt_.rank >= 0 && opt_.rank < opt_.world, "rank ", opt_.rank, " of ", opt_.world);
  AIACC_CHECK_INPUT(opt_.channels >= 1 && opt_.channels <= 16, "channels must be 1..16");
  // Join first, so a rank that never comes is named (Gloo's own wait only names a key).
  store->set(opt_.name + "/joined/" + std::to_string(opt_.rank), std::vector<uint8_t>{1});
  waitForRanks(*store, opt_.name + "/joined", opt_.world, opt_.timeout);
  AIACC_CHECK_INPUT(opt_.heartbeat_timeout.count() >= 0, "heartbeat_timeout must be >= 0");
  for (int c = 0; c < opt_.channels; ++c) channels_.push_back(std::make_unique<Channel>(store, opt_, c));
  if (opt_.heartbeat_timeout.count() > 0 && opt_.world > 1) {
    auto context = connectGloo(store, opt_.name + "/pulse/", opt_.rank, opt_.world, opt_.bind_host, opt_.timeout,
                               "heartbeats");
    pulse_ = std::make_unique<GlooPulse>(std::move(context), opt_.heartbeat_timeout,
                                         [this](const std::string& why) { abort(why); });
  }
}

GlooTransport::~GlooTransport() = default;

std::string GlooTransport::describe() const {
  return strCat("gloo, ", opt_.world, " ranks, ", channels(), channels() == 1 ? " channel" : " channels");
}

ChannelStats GlooTransport::channelStats(int c) const {
  AIACC_CHECK(c >= 0 && c < channels(), "channel ", c, " of ", channels());
  return channels_[static_cast<size_t>(c)]->stats();
}

GlooTransport::Channel& GlooTransport::channel(int c) {
  AIACC_CHECK(c >= 0 && c < channels(), "channel ", c, " of ", channels());
  return *channels_[static_cast<size_t>(c)];
}

namespace {

void waitSend(gloo::transport::UnboundBuffer& b, std::chrono::milliseconds timeout) {
  if (!b.waitSend(timeout)) AIACC_THROW(CommError, "send aborted");
}
void waitRecv(gloo::transport::UnboundBuffer& b, std::chrono::milliseconds timeout) {
  if (!b.waitRecv(timeout)) AIACC_THROW(CommError, "receive aborted");
}

// Ring reduce-scatter in place over uneven shards: P-1 steps; at step s this rank sends shard
// (r-s-1) to its right neighbour and adds shard (r-s-2), received from its left, into its own
// copy. The shard it receives last is its own, then complete. Each rank sends (P-1)/P of the
// buffer: bandwidth-optimal.
void ringReduceScatter(const std::shared_ptr<gloo::Context>& ctx, at::Tensor t, ReduceFn fn) {
  const int P = ctx->size, r = ctx->rank;
  if (P == 1) return;
  const int64_t n = t.numel(), es = static_cast<int64_t>(t.element_size());
  const auto mod = [P](int i) { return ((i % P) + P) % P; };
  int64_t max_count = 0;
  for (int i = 0; i < P; ++i) max_count = std::max(max_count, shardOf(n, P, i).count);
  at::Tensor tmp = at::empty({std::max<int64_t>(1, max_count)}, t.options());
  auto* base = static_cast<char*>(t.data_ptr());
  auto out = ctx->createUnboundBuffer(base, t.nbytes());
  auto in = ctx->createUnboundBuffer(tmp.data_ptr(), tmp.nbytes());
  const uint64_t slot = ctx->nextSlot();
  const int right = mod(r + 1), left = mod(r - 1);
  const auto timeout = ctx->getTimeout();
  for (int s = 0; s < P - 1; ++s) {
    const Shard send = shardOf(n, P, mod(r - s - 1)), recv = shardOf(n, P, mod(r - s - 2));
    if (send.count > 0)
      out->send(right, slot, static_cast<size_t>(send.offset * es), static_cast<size_t>(send.count * es));
    if (recv.count > 0) in->recv(left, slot, 0, static_cast<size_t>(recv.count * es));
    if (recv.count > 0) {
      waitRecv(*in, timeout);
      char* dst = base + recv.offset * es;
      fn(dst, dst, tmp.data_ptr(), static_cast<size_t>(recv.count));
    }
    if (send.count > 0) waitSend(*out, timeout);
  }
}

// Ring allgather in place over uneven shards: at step s this rank forwards shard (r-s) to its
// right and receives shard (r-s-1) from its left, straight into place.
void ringAllgatherShards(const std::shared_ptr<gloo::Context>& ctx, at::Tensor t) {
  const int P = ctx->size, r = ctx->rank;
  if (P == 1) return;
  const int64_t n = t.numel(), es = static_cast<int64_t>(t.element_size());
  const auto mod = [P](int i) { return ((i % P) + P) % P; };
  auto buf = ctx->createUnboundBuffer(t.data_ptr(), t.nbytes());
  const uint64_t slot = ctx->nextSlot();
  const int right = mod(r + 1), left = mod(r - 1);
  const auto timeout = ctx->getTimeout();
  for (int s = 0; s < P - 1; ++s) {
    const Shard send = shardOf(n, P, mod(r - s)), recv = shardOf(n, P, mod(r - s - 1));
    if (send.count > 0)
      buf->send(right, slot, static_cast<size_t>(send.offset * es), static_cast<size_t>(send.count * es));
    if (recv.count > 0)
      buf->recv(left, slot, static_cast<size_t>(recv.offset * es), static_cast<size_t>(recv.count * es));
    if (recv.count > 0) waitRecv(*buf, timeout);
    if (send.count > 0) waitSend(*buf, timeout);
  }
}

}  // namespace

std::shared_ptr<Work> GlooTransport::allreduce(at::Tensor t, ReduceOp op, int c) {
  checkContiguousCpu(t, "allreduce");
  const ReduceFn fn = reduceFunction(t.scalar_type(), op);
  return channel(c).submit(
      "allreduce",
      [t, fn](const std::shared_ptr<gloo::Context>& ctx) {
    gloo::AllreduceOptions o(ctx);
    const size_t n = static_cast<size_t>(t.numel());
    // Gloo sizes its chunks by element type; fn gives the arithmetic meaning.
    switch (t.element_size()) {
      case 1: o.setOutput(static_cast<uint8_t*>(t.data_ptr()), n); break;
      case 2: o.setOutput(static_cast<uint16_t*>(t.data_ptr()), n); break;
      case 4: o.setOutput(static_cast<uint32_t*>(t.data_ptr()), n); break;
      default: o.setOutput(static_cast<uint64_t*>(t.data_ptr()), n); break;
    }
    o.setReduceFunction(fn);
    gloo::allreduce(o);
      },
      t.nbytes());
}

std::shared_ptr<Work> GlooTransport::broadcast(at::Tensor t, int root, int c) {
  checkContiguousCpu(t, "broadcast");
  return channel(c).submit(
      "broadcast",
      [t, root](const std::shared_ptr<gloo::Context>& ctx) {
    gloo::BroadcastOptions o(ctx);
    o.setOutput(static_cast<uint8_t*>(t.data_ptr()), t.nbytes());
    o.setRoot(root);
    gloo::broadcast(o);
      },
      t.nbytes());
}

std::shared_ptr<Work> GlooTransport::allgather(at::Tensor in, at::Tensor out, int c) {
  checkContiguousCpu(in, "allgather");
  checkContiguousCpu(out, "allgather");
  AIACC_CHECK(out.nbytes() == in.nbytes() * static_cast<size_t>(size()), "allgather: out must hold ", size(), " x in");
  return channel(c).submit(
      "allgather",
      [in, out](const std::shared_ptr<gloo::Context>& ctx) {
    gloo::AllgatherOptions o(ctx);
    o.setInput(static_cast<uint8_t*>(in.data_ptr()), in.nbytes());
    o.setOutput(static_cast<uint8_t*>(out.data_ptr()), out.nbytes());
    gloo::allgather(o);
      },
      out.nbytes());
}

std::shared_ptr<Work> GlooTransport::reduceScatter(at::Tensor t, int c) {
  checkContiguousCpu(t, "reduceScatter");
  const ReduceFn fn = reduceFunction(t.scalar_type(), ReduceOp::kSum);
  return channel(c).submit(
      "reduce-scatter", [t, fn](const std::shared_ptr<gloo::Context>& ctx) { ringReduceScatter(ctx, t, fn); },
      t.nbytes());
}

std::shared_ptr<Work> GlooTransport::allgatherShards(at::Tensor t, int c) {
  checkContiguousCpu(t, "allgatherShards");
  return channel(c).submit(
      "allgather", [t](const std::shared_ptr<gloo::Context>& ctx) { ringAllgatherShards(ctx, t); }, t.nbytes());
}

}  // namespace aiacc::comm
