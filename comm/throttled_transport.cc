#include "aiacc/comm/throttled_transport.h"

#include <chrono>
#include <thread>

namespace aiacc::comm {

ThrottledTransport::ThrottledTransport(std::shared_ptr<Transport> inner, std::vector<double> delay)
    : inner_(std::move(inner)), delay_(std::move(delay)) {
  delay_.resize(static_cast<size_t>(inner_->channels()), 0.0);
  for (int c = 0; c < channels(); ++c) workers_.push_back(std::make_unique<ChannelWorker>());
}

ThrottledTransport::~ThrottledTransport() = default;

ChannelStats ThrottledTransport::channelStats(int c) const { return workers_.at(static_cast<size_t>(c))->stats(); }

// The operation and then the throttle's sleep, on the channel's worker: the channel's busy time
// (and so its measured speed) includes the slowdown, as a congested link's would.
std::shared_ptr<Work> ThrottledTransport::run(int c, size_t bytes, std::function<std::shared_ptr<Work>()> op) {
  AIACC_CHECK(c >= 0 && c < channels(), "channel ", c);
  const double extra = delay_[static_cast<size_t>(c)] * static_cast<double>(bytes) / (1 << 20);
  return workers_[static_cast<size_t>(c)]->submit("throttled", bytes, [op = std::move(op), extra] {
    op()->wait();
    if (extra > 0) std::this_thread::sleep_for(std::chrono::duration<double>(extra));
  });
}

std::shared_ptr<Work> ThrottledTransport::allreduce(at::Tensor t, ReduceOp op, int c) {
  return run(c, t.nbytes(), [this, t, op, c] { return inner_->allreduce(t, op, c); });
}
std::shared_ptr<Work> ThrottledTransport::broadcast(at::Tensor t, int root, int c) {
  return run(c, t.nbytes(), [this, t, root, c] { return inner_->broadcast(t, root, c); });
}
std::shared_ptr<Work> ThrottledTransport::allgather(at::Tensor in, at::Tensor out, int c) {
  return run(c, out.nbytes(), [this, in, out, c] { return inner_->allgather(in, out, c); });
}
std::shared_ptr<Work> ThrottledTransport::reduceScatter(at::Tensor t, int c) {
  return run(c, t.nbytes(), [this, t, c] { return inner_->reduceScatter(t, c); });
}
std::shared_ptr<Work> ThrottledTransport::allgatherShards(at::Tensor t, int c) {
  return run(c, t.nbytes(), [this, t, c] { return inner_->allgatherShards(t, c); });
}

void ThrottledTransport::abort(const std::string& why) {
  for (auto& w : workers_) w->abort(why);
  inner_->abort(why);
}

}  // namespace aiacc::comm
