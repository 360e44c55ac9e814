#include "comm/gloo_transport.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "comm/half.h"
#include "comm/store.h"

namespace aiacc::comm {
namespace {

std::string firstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// Gloo's rendezvous talks to a gloo::rendezvous::Store; this adapts a c10d store to it, under a
// key prefix (one per channel).
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(c10::intrusive_ptr<c10d::Store> store, std::string prefix,
                   std::chrono::milliseconds timeout)
      : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(prefix_ + key, std::vector<uint8_t>(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    wait({key});
    const auto v = store_->get(prefix_ + key);
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(prefix_ + k);
    try {
      store_->wait(full, timeout);
    } catch (const std::exception& e) {
      AIACC_THROW(CommError, "timed out after ", timeout.count() / 1000.0,
                  " s waiting for peers to connect (", prefix_, keys.front(),
                  "): a rank did not start or died");
    }
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

class GlooWork : public Work {
 public:
  explicit GlooWork(std::future<void> f) : f_(std::move(f)) {}
  void wait() override {
    if (f_.valid()) f_.get();  // rethrows the background error
  }

 private:
  std::future<void> f_;
};

template <typename T>
void bitwiseOr(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<T*>(c);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] | y[i];
}

}  // namespace

// One Gloo context and the thread that runs its collectives, in submission order.
class GlooTransport::Channel {
 public:
  Channel(c10::intrusive_ptr<c10d::Store> store, const GlooOptions& o, int index)
      : index_(index), timeline_(o.timeline) {
    if (timeline_) timeline_->nameRow(1 + index, "channel " + std::to_string(index));
    gloo::transport::tcp::attr attr;
    attr.hostname = o.bind_host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    context_ = std::make_shared<gloo::rendezvous::Context>(o.rank, o.world);
    context_->setTimeout(o.timeout);
    GlooStoreAdapter adapter(std::move(store), o.name + "/ch" + std::to_string(index) + "/", o.timeout);
    try {
      context_->connectFullMesh(adapter, device);
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& e) {
      AIACC_THROW(CommError, "channel ", index, ": connecting to peers failed: ", firstLine(e.what()));
    }
    thread_ = std::thread([this] { loop(); });
  }
  ~Channel() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  ChannelStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  std::shared_ptr<Work> submit(const char* what, std::function<void(const std::shared_ptr<gloo::Context>&)> fn,
                               size_t bytes = 0) {
    auto task = std::make_shared<std::packaged_task<void()>>([this, what, bytes, fn = std::move(fn)] {
      try {
        const auto t0 = std::chrono::steady_clock::now();
        fn(context_);
        const auto t1 = std::chrono::steady_clock::now();
        const double s = std::chrono::duration<double>(t1 - t0).count();
        if (timeline_) timeline_->span(what, 1 + index_, t0, t1, "{\"bytes\": " + std::to_string(bytes) + "}");
        std::lock_guard<std::mutex> lock(mu_);
        stats_.bytes += static_cast<double>(bytes);
        stats_.busy_s += s;
      } catch (const CommError&) {
        throw;
      } catch (const std::exception& e) {
        AIACC_THROW(CommError, "collective failed on rank ", context_->rank, ": ",
                    firstLine(e.what()), " (a peer died or timed out)");
      }
    });
    auto work = std::make_shared<GlooWork>(task->get_future());
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back([task] { (*task)(); });
    }
    cv_.notify_one();
    return work;
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop requested and nothing left
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      job();
    }
  }

  int index_;
  std::shared_ptr<Timeline> timeline_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  mutable std::mutex mu_;
  ChannelStats stats_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

GlooTransport::GlooTransport(c10::intrusive_ptr<c10d::Store> store, const GlooOptions& options)
    : opt_(options), store_(store) {
  // A peer that dies closes its sockets; writing to them raises SIGPIPE, whose default action
  // kills this process before Gloo can report the error. Ignore it (as Python does), so a dead
  // peer becomes a CommError naming the failed collective.
  ::signal(SIGPIPE, SIG_IGN);
  AIACC_CHECK(opt_.world >= 1 && opt_.rank >= 0 && opt_.rank < opt_.world, "rank ", opt_.rank,
              " of ", opt_.world);
  AIACC_CHECK_INPUT(opt_.channels >= 1 && opt_.channels <= 16, "channels must be 1..16");
  // Join first, so a rank that never comes is named (Gloo's own wait only names a key).
  store->set(opt_.name + "/joined/" + std::to_string(opt_.rank), {1});
  waitForRanks(*store, opt_.name + "/joined", opt_.world, opt_.timeout);
  for (int c = 0; c < opt_.channels; ++c) channels_.push_back(std::make_unique<Channel>(store, opt_, c));
}

GlooTransport::~GlooTransport() = default;

ChannelStats GlooTransport::channelStats(int c) const {
  AIACC_CHECK(c >= 0 && c < channels(), "channel ", c, " of ", channels());
  return channels_[static_cast<size_t>(c)]->stats();
}

GlooTransport::Channel& GlooTransport::channel(int c) {
  AIACC_CHECK(c >= 0 && c < channels(), "channel ", c, " of ", channels());
  return *channels_[static_cast<size_t>(c)];
}

namespace {
void checkContiguousCpu(const at::Tensor& t, const char* what) {
  AIACC_CHECK(t.is_contiguous() && t.device().is_cpu(), what, " needs a contiguous CPU tensor");
}
}  // namespace

std::shared_ptr<Work> GlooTransport::allreduce(at::Tensor t, ReduceOp op, int c) {
  checkContiguousCpu(t, "allreduce");
  return channel(c).submit("allreduce", [t, op](const std::shared_ptr<gloo::Context>& ctx) {
    gloo::AllreduceOptions o(ctx);
    const size_t n = static_cast<size_t>(t.numel());
    using Fn = void (*)(void*, const void*, const void*, size_t);
    switch (t.scalar_type()) {
      case at::kFloat:
        AIACC_CHECK(op == ReduceOp::kSum, "float allreduce supports sum only");
        o.setOutput(t.data_ptr<float>(), n);
        o.setReduceFunction(static_cast<Fn>(&gloo::sum<float>));
        break;
      case at::kDouble:
        AIACC_CHECK(op == ReduceOp::kSum, "double allreduce supports sum only");
        o.setOutput(t.data_ptr<double>(), n);
        o.setReduceFunction(static_cast<Fn>(&gloo::sum<double>));
        break;
      case at::kHalf:
        AIACC_CHECK(op == ReduceOp::kSum, "half allreduce supports sum only");
        o.setOutput(reinterpret_cast<gloo::float16*>(t.data_ptr<at::Half>()), n);
        o.setReduceFunction(static_cast<Fn>(&sumHalf));  // F16C, fp32 arithmetic per step
        break;
      case at::kLong:
        o.setOutput(t.data_ptr<int64_t>(), n);
        o.setReduceFunction(op == ReduceOp::kSum ? static_cast<Fn>(&gloo::sum<int64_t>)
                                                 : static_cast<Fn>(&bitwiseOr<int64_t>));
        break;
      case at::kByte:
        o.setOutput(t.data_ptr<uint8_t>(), n);
        o.setReduceFunction(op == ReduceOp::kSum ? static_cast<Fn>(&gloo::sum<uint8_t>)
                                                 : static_cast<Fn>(&bitwiseOr<uint8_t>));
        break;
      default:
        AIACC_THROW(Error, "allreduce: unsupported dtype ", t.scalar_type());
    }
    gloo::allreduce(o);
  }, t.nbytes());
}

std::shared_ptr<Work> GlooTransport::broadcast(at::Tensor t, int root, int c) {
  checkContiguousCpu(t, "broadcast");
  return channel(c).submit("broadcast", [t, root](const std::shared_ptr<gloo::Context>& ctx) {
    gloo::BroadcastOptions o(ctx);
    o.setOutput(static_cast<uint8_t*>(t.data_ptr()), t.nbytes());
    o.setRoot(root);
    gloo::broadcast(o);
  }, t.nbytes());
}

std::shared_ptr<Work> GlooTransport::allgather(at::Tensor in, at::Tensor out, int c) {
  checkContiguousCpu(in, "allgather");
  checkContiguousCpu(out, "allgather");
  AIACC_CHECK(out.nbytes() == in.nbytes() * static_cast<size_t>(size()), "allgather: out must hold ",
              size(), " x in");
  return channel(c).submit("allgather", [in, out](const std::shared_ptr<gloo::Context>& ctx) {
    gloo::AllgatherOptions o(ctx);
    o.setInput(static_cast<uint8_t*>(in.data_ptr()), in.nbytes());
    o.setOutput(static_cast<uint8_t*>(out.data_ptr()), out.nbytes());
    gloo::allgather(o);
  }, out.nbytes());
}

// Reduce-scatter as allreduce of a copy, then this rank's slice: correct for any size, but moves
// the whole buffer; a bandwidth-optimal ring reduce-scatter belongs with two-level reduction.
std::shared_ptr<Work> GlooTransport::reduceScatter(at::Tensor in, at::Tensor out, int c) {
  checkContiguousCpu(in, "reduceScatter");
  AIACC_CHECK(in.numel() == out.numel() * size(), "reduceScatter: in must hold ", size(), " x out");
  at::Tensor tmp = in.clone();
  auto reduced = allreduce(tmp, ReduceOp::kSum, c);
  const int r = rank();
  return channel(c).submit("reduce-scatter", [reduced, tmp, out, r](const std::shared_ptr<gloo::Context>&) mutable {
    reduced->wait();
    out.copy_(tmp.view(-1).narrow(0, r * out.numel(), out.numel()).view_as(out));
  });
}

}  // namespace aiacc::comm
