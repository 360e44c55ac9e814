#include "aiacc/comm/nccl_transport.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "aiacc/comm/failure.h"
#include "aiacc/comm/nccl_env.h"
#include "aiacc/comm/op_timing.h"
#include "aiacc/comm/store.h"

namespace aiacc::comm {
// Named, not anonymous: NcclTransport::Channel (declared in the header) holds a ChannelCore, and a
// class with external linkage must not have members whose type has internal linkage.
namespace nccl_channel {

using Clock = std::chrono::steady_clock;

const char* errorTypeName(c10d::ErrorType e) {
  switch (e) {
    case c10d::ErrorType::TIMEOUT: return "an operation timed out";
    case c10d::ErrorType::COMM_ERROR: return "an NCCL error";
    case c10d::ErrorType::REMOTE_ERROR: return "another rank's failure, propagated through the store";
    case c10d::ErrorType::SUCCESS: break;
  }
  return "no error";
}

// What a channel's works share with it (they may outlive the transport): the process group,
// the channel's first failure, and the checks that turn ProcessGroupNCCL's asynchronous errors
// into a CommError on the host.
class ChannelCore {
 public:
  ChannelCore(c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg, int index, int rank, int world,
              std::chrono::milliseconds timeout)
      : pg_(std::move(pg)), index_(index), rank_(rank), world_(world), timeout_(timeout) {}

  c10d::ProcessGroupNCCL& pg() { return *pg_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  std::string where(const char* what) const {
    return strCat("NCCL ", what, " (channel ", index_, ", rank ", rank_, " of ", world_, ")");
  }

  // Latches `e` unless an earlier error came first, aborts the communicators (once), and throws
  // the first error.
  [[noreturn]] void fail(Failure f) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!first_) first_ = std::move(f);
    }
    abortCommunicators();
    throwIfFailed();
    std::abort();  // unreachable: first_ is set
  }
  [[noreturn]] void fail(const std::string& message) { fail(Failure::comm(message)); }
  void throwIfFailed() const {
    Failure f;
    {
      std::lock_guard<std::mutex> lock(mu_);
      f = first_;
    }
    if (f) f.raise();
  }
  bool failed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<bool>(first_);
  }
  void abortCommunicators() {
    if (aborted_.exchange(true)) return;
    try {
      pg_->abort();
    } catch (const std::exception&) {  // aborting is the last word; its own failure is not news
    }
  }

  // Non-blocking: raises the channel's first error, or the process group's failure state (set by
  // ProcessGroupNCCL's watchdog when it finds an operation timed out or an NCCL error, here or,
  // through the store, on another rank). The watchdog aborts the communicators itself only after
  // a pause for its flight recorder; failing here aborts them at once.
  void checkHealth(const char* what) {
    throwIfFailed();
    const c10d::ErrorType e = pg_->getError();
    if (e != c10d::ErrorType::SUCCESS) {
      fail(strCat(where(what), " failed: ProcessGroupNCCL reports ", errorTypeName(e), " (timeout ", timeout_.count(),
                  " ms)"));
    }
  }

  // A completed operation's own error (ProcessGroupNCCL sets it when it finds the
  // communicator's asynchronous error), latched.
  void checkCompleted(const c10::intrusive_ptr<c10d::Work>& w, const char* what) {
    if (auto e = w->exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        fail(strCat(where(what), " failed: ", firstLine(x.what())));
      }
    }
  }

  // Blocks the host until `w` (submitted at `t0`) completed, polling its state, the channel's
  // health and the timeout; raises instead of returning when any of them says it failed (an
  // aborted communicator ends its kernels too, so completion alone proves nothing).
  void waitOnHost(const c10::intrusive_ptr<c10d::Work>& w, Clock::time_point t0, const char* what) {
    auto pause = std::chrono::microseconds(20);
    for (;;) {
      checkHealth(what);
      if (w->isCompleted()) break;
      if (Clock::now() - t0 > timeout_) {
        fail(strCat(where(what), " timed out on the host after ", timeout_.count(), " ms"));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
    }
    checkCompleted(w, what);
    checkHealth(what);
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg_;
  int index_, rank_, world_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  Failure first_;  // a value: works on other threads raise their own copy (failure.h)
  std::atomic<bool> aborted_{false};
};

// One operation. wait(): the channel's health is checked, then the caller's current stream waits
// for the operation (ProcessGroupNCCL's wait without blocking-wait mode orders streams only);
// with `after` (a host tensor staged through the device) the host then blocks until the
// operation completed (waitOnHost) and `after` copies the result back. synchronize(): wait(),
// then the host blocks until it completed. Errors are sticky: raised again by every wait() and
// by the channel's later operations.
class PgWork : public Work {
 public:
  PgWork(std::shared_ptr<ChannelCore> core, const char* what, c10::intrusive_ptr<c10d::Work> w,
         std::function<void()> after)
      : core_(std::move(core)), what_(what), w_(std::move(w)), after_(std::move(after)), t0_(Clock::now()) {}

  void wait() override {
    if (error_) error_.raise();
    try {
      core_->checkHealth(what_);
      if (w_ && !ordered_) {
        try {
          w_->wait();
        } catch (const CommError&) {
          throw;
        } catch (const std::exception& e) {
          core_->fail(strCat(core_->where(what_), " failed: ", firstLine(e.what())));
        }
        ordered_ = true;
      }
      if (w_ && after_) core_->waitOnHost(w_, t0_, what_);
    } catch (...) {
      error_ = Failure::current();
      throw;
    }
    if (after_) {
      auto f = std::move(after_);
      after_ = nullptr;
      f();
    }
  }

  void synchronize() override {
    wait();
    if (!w_) return;
    try {
      core_->waitOnHost(w_, t0_, what_);
    } catch (...) {
      error_ = Failure::current();
      throw;
    }
  }

 private:
  std::shared_ptr<ChannelCore> core_;
  const char* what_;
  c10::intrusive_ptr<c10d::Work> w_;
  std::function<void()> after_;
  Clock::time_point t0_;
  bool ordered_ = false;
  Failure error_;
};

}  // namespace nccl_channel
using nccl_channel::ChannelCore;
using nccl_channel::PgWork;

class NcclTransport::Channel {
 public:
  Channel(const c10::intrusive_ptr<c10d::Store>& store, const NcclOptions& o, int index)
      : device_(static_cast<c10::DeviceIndex>(o.device)) {
    c10::cuda::CUDAGuard guard(device_);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(strCat(o.name, "/pg", index), store);
    auto options = c10d::ProcessGroupNCCL::Options::create(/*is_high_priority_stream=*/true);
    options->timeout = o.timeout;
    c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg;
    const auto t0 = nccl_channel::Clock::now();
    auto failed = [&](const std::string& why) {
      if (pg) {
        try {
          pg->abort();  // not a teardown that waits for a communicator that never came
        } catch (const std::exception&) {
        }
      }
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(nccl_channel::Clock::now() - t0).count();
      AIACC_THROW(CommError, "NCCL set-up of channel ", index, " (rank ", o.rank, " of ", o.world, ", cuda:", o.device,
                  ") failed after ", ms, " ms: ", why);
    };
    try {
      pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, o.rank, o.world, options);
      pg->eagerConnectSingleDevice(at::Device(at::kCUDA, device_));
    } catch (const std::exception& e) {
      failed(firstLine(e.what()));
    }
    // A non-blocking set-up returns before the communicator exists: a peer gone silent would
    // surface only at the first operation, or as a teardown that waits. One element reduced
    // here proves every rank's communicator made: its launch waits for the communicator
    // (TORCH_NCCL_NONBLOCKING_TIMEOUT, comm/nccl_env.h), then the host waits for the operation
    // (NcclOptions::timeout). Seen on an H200: without it the set-up "succeeded" and the
    // transport's destructor waited out the non-blocking timeout.
    c10::intrusive_ptr<c10d::Work> ready;
    try {
      std::vector<at::Tensor> one{at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device_))};
      ready = pg->allreduce(one);
    } catch (const std::exception& e) {
      failed(firstLine(e.what()));
    }
    core_ = std::make_shared<ChannelCore>(pg, index, o.rank, o.world, o.timeout);
    try {
      core_->waitOnHost(ready, t0, "set-up");
    } catch (const CommError& e) {
      failed(firstLine(e.what()));
    }
  }

  ~Channel() {
    try {
      if (core_->failed()) {
        core_->abortCommunicators();
      } else {
        core_->pg().shutdown();
      }
    } catch (const std::exception&) {  // nothing to report at teardown; the first error already was
    }
  }

  c10d::ProcessGroupNCCL& pg() { return core_->pg(); }
  void abort(const std::string& why) {
    try {
      core_->fail(why);
    } catch (const CommError&) {  // latched: every later operation and wait() raises it
    }
  }
  c10::DeviceIndex device() const { return device_; }

  // Submits one operation through `launch`, unless the channel already failed.
  std::shared_ptr<Work> run(const char* what, size_t bytes,
                            const std::function<c10::intrusive_ptr<c10d::Work>()>& launch,
                            std::function<void()> after = nullptr);

  // An operation that was already complete (nothing left on the device).
  std::shared_ptr<Work> done(const char* what) { return std::make_shared<PgWork>(core_, what, nullptr, nullptr); }

  // Blocks the host until the last operation submitted (and so every earlier one: one stream)
  // completed; raises the channel's error.
  void synchronize() {
    c10::intrusive_ptr<c10d::Work> last;
    nccl_channel::Clock::time_point t0;
    const char* what = "operation";
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = last_;
      t0 = last_t0_;
      what = last_what_;
    }
    if (!last) {
      core_->checkHealth(what);
      return;
    }
    core_->waitOnHost(last, t0, what);
  }

  ChannelStats stats() { return timing_.stats(); }

 private:
  c10::DeviceIndex device_;
  std::shared_ptr<ChannelCore> core_;
  OpTiming timing_;  // bytes and busy time of completed operations; bounded
  std::mutex mu_;    // last_*
  c10::intrusive_ptr<c10d::Work> last_;
  nccl_channel::Clock::time_point last_t0_;
  const char* last_what_ = "operation";
};

std::shared_ptr<Work> NcclTransport::Channel::run(const char* what, size_t bytes,
                                                  const std::function<c10::intrusive_ptr<c10d::Work>()>& launch,
                                                  std::function<void()> after) {
  core_->checkHealth(what);
  c10::cuda::CUDAGuard guard(device_);
  c10::intrusive_ptr<c10d::Work> w;
  try {
    w = launch();
  } catch (const std::exception& e) {
    core_->fail(strCat(core_->where(what), " failed: ", firstLine(e.what())));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_ = w;
    last_t0_ = nccl_channel::Clock::now();
    last_what_ = what;
  }
  // Retired when complete (at a later submission or stats()), with its CUDA-timed duration;
  // without TORCH_NCCL_ENABLE_TIMING=1 getDuration() throws, and the time counts as 0. A
  // completed operation's own error is latched here, to be raised by the next call.
  std::shared_ptr<ChannelCore> core = core_;
  timing_.submitted({static_cast<double>(bytes),
                     [w, core, what] {
    if (!w->isCompleted()) return false;
    try {
      core->checkCompleted(w, what);
    } catch (const CommError&) {  // latched
    }
    return true;
                     },
                     [w]() -> double {
                       try {
                         return w->getDuration() / 1e3;
                       } catch (const std::exception&) {
                         return 0.0;
                       }
                     }});
  return std::make_shared<PgWork>(core_, what, std::move(w), std::move(after));
}

NcclTransport::NcclTransport(c10::intrusive_ptr<c10d::Store> store, const NcclOptions& options) : opt_(options) {
  AIACC_CHECK(opt_.world >= 1 && opt_.rank >= 0 && opt_.rank < opt_.world, "rank ", opt_.rank, " of ", opt_.world);
  AIACC_CHECK_INPUT(opt_.channels >= 1 && opt_.channels <= 16, "channels must be 1..16");
  // ProcessGroupNCCL reads its error handling from the environment (the program's to set:
  // comm/nccl_env.h); what differs from what this transport is built for is said once.
  if (opt_.log && opt_.rank == 0) {
    for (const std::string& note : ncclEnvironmentNotes()) opt_.log("NCCL: " + note);
  }
  store->set(opt_.name + "/joined/" + std::to_string(opt_.rank), std::vector<uint8_t>{1});
  waitForRanks(*store, opt_.name + "/joined", opt_.world, opt_.timeout);
  for (int c = 0; c < opt_.channels; ++c) channels_.push_back(std::make_unique<Channel>(store, opt_, c));
}

NcclTransport::~NcclTransport() = default;

void NcclTransport::synchronize() {
  for (auto& ch : channels_) ch->synchronize();
}

void NcclTransport::abort(const std::string& why) {
  for (auto& ch : channels_) ch->abort(why);
}

std::string NcclTransport::describe() const {
  return strCat("nccl, ", opt_.world, " ranks, ", channels(), channels() == 1 ? " channel" : " channels");
}

NcclTransport::Channel& NcclTransport::channel(int c) const {
  AIACC_CHECK(c >= 0 && c < channels(), "channel ", c, " of ", channels());
  return *channels_[static_cast<size_t>(c)];
}

ChannelStats NcclTransport::channelStats(int c) const { return channel(c).stats(); }

namespace {
// A host tensor travels through the device; the result is copied back when waited for.
struct Staged {
  at::Tensor device;
  std::function<void()> back;
};
Staged stage(const at::Tensor& t, c10::DeviceIndex device) {
  AIACC_CHECK(t.is_contiguous(), "NCCL needs contiguous tensors");
  if (t.is_cuda()) return {t, nullptr};
  at::Tensor d = t.to(at::Device(at::kCUDA, device));
  return {d, [t, d]() mutable {
            c10::cuda::getCurrentCUDAStream(d.device().index()).synchronize();
            t.copy_(d.cpu());
          }};
}

std::vector<at::Tensor> shardViews(const at::Tensor& flat, int parts) {
  std::vector<at::Tensor> v;
  for (int q = 0; q < parts; ++q) {
    const Shard sh = shardOf(flat.numel(), parts, q);
    v.push_back(flat.narrow(0, sh.offset, sh.count));
  }
  return v;
}
}  // namespace

std::shared_ptr<Work> NcclTransport::allreduce(at::Tensor t, ReduceOp op, int c) {
  Channel& ch = channel(c);
  Staged s = stage(t, ch.device());
  at::Tensor d = s.device;
  if (op == ReduceOp::kBitwiseOr) {  // no NCCL op: gather every rank's, fold locally
    at::Tensor flat = d.view(-1);
    at::Tensor all = at::empty({size() * flat.numel()}, d.options());
    auto w = ch.run("allgather (bitwise or)", all.nbytes(), [&] { return ch.pg()._allgather_base(all, flat); });
    if (s.back) {
      w->synchronize();  // the host reads the result: a failed operation raises here
    } else {
      w->wait();
    }
    at::Tensor rows = all.view({size(), flat.numel()});
    at::Tensor folded = rows[0].clone();
    for (int r = 1; r < size(); ++r) folded.bitwise_or_(rows[r]);
    flat.copy_(folded);
    if (s.back) s.back();
    return ch.done("bitwise-or allreduce");
  }
  return ch.run(
      "allreduce", d.nbytes(),
      [&] {
    std::vector<at::Tensor> v{d};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    return ch.pg().allreduce(v, o);
      },
      s.back);
}

std::shared_ptr<Work> NcclTransport::broadcast(at::Tensor t, int root, int c) {
  Channel& ch = channel(c);
  Staged s = stage(t, ch.device());
  at::Tensor d = s.device;
  return ch.run(
      "broadcast", d.nbytes(),
      [&] {
    std::vector<at::Tensor> v{d};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    return ch.pg().broadcast(v, o);
      },
      s.back);
}

std::shared_ptr<Work> NcclTransport::allgather(at::Tensor in, at::Tensor out, int c) {
  Channel& ch = channel(c);
  AIACC_CHECK(out.nbytes() == in.nbytes() * static_cast<size_t>(size()), "allgather: out must hold ", size(), " x in");
  AIACC_CHECK(out.scalar_type() == in.scalar_type(), "allgather: in and out of different dtypes");
  Staged si = stage(in, ch.device()), so = stage(out, ch.device());
  at::Tensor di = si.device.view(-1), dout = so.device.view(-1);
  return ch.run(
      "allgather", dout.nbytes(), [&] { return ch.pg()._allgather_base(dout, di); }, so.back);
}

std::shared_ptr<Work> NcclTransport::reduceScatter(at::Tensor t, int c) {
  Channel& ch = channel(c);
  Staged s = stage(t, ch.device());
  at::Tensor d = s.device.view(-1);
  const int P = size();
  return ch.run(
      "reduce-scatter", d.nbytes(),
      [&] {
    c10d::ReduceScatterOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    std::vector<at::Tensor> shards = shardViews(d, P);
    at::Tensor mine = shards[static_cast<size_t>(rank())];
    if (d.numel() % P == 0) return ch.pg()._reduce_scatter_base(mine, d, o);  // in place: shard r of the input
    std::vector<at::Tensor> outputs{mine};
    std::vector<std::vector<at::Tensor>> inputs{shards};
    return ch.pg().reduce_scatter(outputs, inputs, o);  // uneven: a reduce per shard, grouped
      },
      s.back);
}

std::shared_ptr<Work> NcclTransport::allgatherShards(at::Tensor t, int c) {
  Channel& ch = channel(c);
  Staged s = stage(t, ch.device());
  at::Tensor d = s.device.view(-1);
  const int P = size();
  return ch.run(
      "allgather of shards", d.nbytes(),
      [&] {
    std::vector<at::Tensor> shards = shardViews(d, P);
    at::Tensor mine = shards[static_cast<size_t>(rank())];
    if (d.numel() % P == 0) return ch.pg()._allgather_base(d, mine);  // in place
    std::vector<std::vector<at::Tensor>> outputs{shards};
    std::vector<at::Tensor> inputs{mine};
    return ch.pg().allgather(outputs, inputs);  // uneven: a broadcast per shard, grouped
      },
      s.back);
}

}  // namespace aiacc::comm
