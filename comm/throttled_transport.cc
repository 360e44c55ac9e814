#include "comm/throttled_transport.h"

#include <chrono>
#include <future>

namespace aiacc::comm {
namespace {
class FutureWork : public Work {
 public:
  explicit FutureWork(std::future<void> f) : f_(std::move(f)) {}
  void wait() override {
    if (f_.valid()) f_.get();
  }

 private:
  std::future<void> f_;
};
}  // namespace

ThrottledTransport::ThrottledTransport(std::shared_ptr<Transport> inner, std::vector<double> delay)
    : inner_(std::move(inner)), delay_(std::move(delay)) {
  delay_.resize(static_cast<size_t>(inner_->channels()), 0.0);
  queues_.resize(delay_.size());
  stats_.resize(delay_.size());
  for (int c = 0; c < channels(); ++c) threads_.emplace_back([this, c] { loop(c); });
}

ThrottledTransport::~ThrottledTransport() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

ChannelStats ThrottledTransport::channelStats(int c) const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.at(static_cast<size_t>(c));
}

void ThrottledTransport::loop(int c) {
  auto& q = queues_[static_cast<size_t>(c)];
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !q.empty(); });
      if (q.empty()) return;
      job = std::move(q.front());
      q.pop_front();
    }
    job();
  }
}

std::shared_ptr<Work> ThrottledTransport::run(int c, size_t bytes, std::function<std::shared_ptr<Work>()> op) {
  AIACC_CHECK(c >= 0 && c < channels(), "channel ", c);
  auto task = std::make_shared<std::packaged_task<void()>>([this, c, bytes, op = std::move(op)] {
    const auto t0 = std::chrono::steady_clock::now();
    op()->wait();
    const double extra = delay_[static_cast<size_t>(c)] * static_cast<double>(bytes) / (1 << 20);
    if (extra > 0) std::this_thread::sleep_for(std::chrono::duration<double>(extra));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(mu_);
    stats_[static_cast<size_t>(c)].bytes += static_cast<double>(bytes);
    stats_[static_cast<size_t>(c)].busy_s += s;
  });
  auto work = std::make_shared<FutureWork>(task->get_future());
  {
    std::lock_guard<std::mutex> lock(mu_);
    queues_[static_cast<size_t>(c)].push_back([task] { (*task)(); });
  }
  cv_.notify_all();
  return work;
}

std::shared_ptr<Work> ThrottledTransport::allreduce(at::Tensor t, ReduceOp op, int c) {
  return run(c, t.nbytes(), [=] { return inner_->allreduce(t, op, c); });
}
std::shared_ptr<Work> ThrottledTransport::broadcast(at::Tensor t, int root, int c) {
  return run(c, t.nbytes(), [=] { return inner_->broadcast(t, root, c); });
}
std::shared_ptr<Work> ThrottledTransport::allgather(at::Tensor in, at::Tensor out, int c) {
  return run(c, out.nbytes(), [=] { return inner_->allgather(in, out, c); });
}
std::shared_ptr<Work> ThrottledTransport::reduceScatter(at::Tensor t, int c) {
  return run(c, t.nbytes(), [=] { return inner_->reduceScatter(t, c); });
}
std::shared_ptr<Work> ThrottledTransport::allgatherShards(at::Tensor t, int c) {
  return run(c, t.nbytes(), [=] { return inner_->allgatherShards(t, c); });
}

}  // namespace aiacc::comm
