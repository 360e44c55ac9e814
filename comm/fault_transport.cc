#include "aiacc/comm/fault_transport.h"

#include "aiacc/common/error.h"

namespace aiacc::comm {

class FailedWork : public Work {
 public:
  explicit FailedWork(std::string why) : why_(std::move(why)) {}
  void wait() override { throw CommError(why_); }
  Failure failure() const override { return Failure::comm(why_); }

 private:
  std::string why_;
};

// Blocks until the transport is released (abort, destructor) or the stall limit passes.
class FaultTransport::StalledWork : public Work {
 public:
  StalledWork(std::shared_ptr<Release> release, std::chrono::steady_clock::time_point deadline, std::string what)
      : release_(std::move(release)), deadline_(deadline), what_(std::move(what)) {}
  void wait() override {
    std::unique_lock<std::mutex> lock(release_->mu);
    const bool released = release_->cv.wait_until(lock, deadline_, [&] { return !release_->why.empty(); });
    throw CommError(message(released));
  }
  Failure failure() const override {
    std::lock_guard<std::mutex> lock(release_->mu);
    if (!release_->why.empty()) return Failure::comm(message(true));
    return std::chrono::steady_clock::now() >= deadline_ ? Failure::comm(message(false)) : Failure();
  }

 private:
  std::string message(bool released) const {  // (under release_->mu)
    return strCat(what_, "; ", released ? release_->why : "the stall limit passed");
  }

  std::shared_ptr<Release> release_;
  std::chrono::steady_clock::time_point deadline_;
  std::string what_;
};

FaultTransport::FaultTransport(std::shared_ptr<Transport> inner, FaultSpec fault)
    : inner_(std::move(inner)), fault_(fault) {
  AIACC_CHECK(inner_, "FaultTransport needs a transport to wrap");
}

namespace {
void releaseStalls(FaultTransport::Release& r, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.why.empty()) r.why = why.empty() ? "aborted" : why;
  }
  r.cv.notify_all();
}
}  // namespace

FaultTransport::~FaultTransport() { releaseStalls(*release_, "its transport was destroyed"); }

void FaultTransport::abort(const std::string& why) {
  releaseStalls(*release_, why);
  inner_->abort(why);
}

template <typename Op>
std::shared_ptr<Work> FaultTransport::run(const char* what, Op op) {
  int64_t k;
  {
    std::lock_guard<std::mutex> lock(mu_);
    k = ops_++;
    const bool hit = fault_.kind != FaultSpec::Kind::kNone &&
                     (k == fault_.at || (fault_.kind == FaultSpec::Kind::kStall && k > fault_.at));
    if (hit && !struck_) {
      struck_ = true;
      struck_at_ = std::chrono::steady_clock::now();
    }
    if (hit && fault_.kind == FaultSpec::Kind::kFail) {
      return std::make_shared<FailedWork>(strCat("injected failure of operation ", k, " (", what, ") on rank ",
                                                 inner_->rank()));
    }
    if (hit) {
      return std::make_shared<StalledWork>(release_, struck_at_ + fault_.stall_limit,
                                           strCat("rank ", inner_->rank(), " stalled (injected) at operation ", k, " (",
                                                  what, ")"));
    }
  }
  return op();
}

std::shared_ptr<Work> FaultTransport::allreduce(at::Tensor t, ReduceOp op, int c) {
  return run("allreduce", [&] { return inner_->allreduce(t, op, c); });
}
std::shared_ptr<Work> FaultTransport::broadcast(at::Tensor t, int root, int c) {
  return run("broadcast", [&] { return inner_->broadcast(t, root, c); });
}
std::shared_ptr<Work> FaultTransport::allgather(at::Tensor in, at::Tensor out, int c) {
  return run("allgather", [&] { return inner_->allgather(in, out, c); });
}
std::shared_ptr<Work> FaultTransport::reduceScatter(at::Tensor t, int c) {
  return run("reduce-scatter", [&] { return inner_->reduceScatter(t, c); });
}
std::shared_ptr<Work> FaultTransport::allgatherShards(at::Tensor t, int c) {
  return run("allgather-shards", [&] { return inner_->allgatherShards(t, c); });
}

int64_t FaultTransport::operations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ops_;
}
bool FaultTransport::struck() const {
  std::lock_guard<std::mutex> lock(mu_);
  return struck_;
}
std::chrono::steady_clock::time_point FaultTransport::struckAt() const {
  std::lock_guard<std::mutex> lock(mu_);
  return struck_at_;
}

}  // namespace aiacc::comm
