#include "aiacc/comm/striped_transport.h"

#include <algorithm>
#include <cmath>
#include <exception>

namespace aiacc::comm {
namespace {

class AllWork : public Work {
 public:
  AllWork(std::vector<std::shared_ptr<Work>> parts, std::shared_ptr<Transport> inner)
      : parts_(std::move(parts)), inner_(std::move(inner)) {}
  // Every piece, as comm::waitAll: the first failure aborts the wrapped transport, so a piece
  // stalled on another channel ends at once.
  void wait() override { waitAll(false); }
  void synchronize() override { waitAll(true); }
  Failure failure() const override { return firstFailure(parts_); }

 private:
  void waitAll(bool host) {
    comm::waitAll(parts_, host, [this](const std::string& why) { inner_->abort(why); });
  }

  std::vector<std::shared_ptr<Work>> parts_;
  std::shared_ptr<Transport> inner_;
};

}  // namespace

StripedTransport::StripedTransport(std::shared_ptr<Transport> inner, StripingOptions options)
    : inner_(std::move(inner)), opt_(options) {
  AIACC_CHECK(inner_, "StripedTransport needs a transport to wrap");
  setActiveChannels(opt_.channels > 0 ? opt_.channels : inner_->channels());
}

void StripedTransport::setActiveChannels(int k) {
  k = std::max(1, std::min(k, inner_->channels()));
  weights_.assign(static_cast<size_t>(k), 1.0 / k);
  last_stats_.clear();
  for (int c = 0; c < k; ++c) last_stats_.push_back(inner_->channelStats(c));
}

void StripedTransport::setWeights(const std::vector<double>& weights) {
  AIACC_CHECK(weights.size() == weights_.size(), "striping: ", weights.size(), " shares for ", weights_.size(),
              " active channels");
  double sum = 0;
  for (double w : weights) {
    AIACC_CHECK(std::isfinite(w) && w > 0, "striping: a channel share must be positive and finite, not ", w);
    sum += w;
  }
  AIACC_CHECK(std::abs(sum - 1) < 1e-9, "striping: channel shares must sum to 1 (they sum to ", sum, ")");
  weights_ = weights;  // as they were, to the bit: they decide where each split bucket is cut
}

std::shared_ptr<Work> StripedTransport::allreduce(at::Tensor t, ReduceOp op, int) {
  const int k = activeChannels();
  if (k == 1) return inner_->allreduce(std::move(t), op, 0);
  if (static_cast<int64_t>(t.nbytes()) < opt_.min_split_bytes) {
    const int c = static_cast<int>(next_++ % static_cast<size_t>(k));
    return inner_->allreduce(std::move(t), op, c);
  }
  const int64_t n = t.numel();
  std::vector<std::shared_ptr<Work>> parts;
  int64_t off = 0;
  for (int c = 0; c < k; ++c) {
    const int64_t len = c == k - 1 ? n - off
                                   : static_cast<int64_t>(static_cast<double>(n) * weights_[static_cast<size_t>(c)]);
    if (len > 0) parts.push_back(inner_->allreduce(t.narrow(0, off, len), op, c));
    off += len;
  }
  return std::make_shared<AllWork>(std::move(parts), inner_);
}

void StripedTransport::rebalance() {
  const int k = activeChannels();
  if (k < 2 || !opt_.balance) return;
  at::Tensor rate = at::zeros({k}, at::kDouble);
  for (int c = 0; c < k; ++c) {
    const ChannelStats now = inner_->channelStats(c);
    const ChannelStats& last = last_stats_[static_cast<size_t>(c)];
    const double bytes = now.bytes - last.bytes, secs = now.busy_s - last.busy_s;
    rate.data_ptr<double>()[c] = secs > 0 && bytes > 0 ? bytes / secs : 0.0;
  }
  inner_->allreduce(rate, ReduceOp::kSum, 0)->wait();
  for (int c = 0; c < k; ++c) last_stats_[static_cast<size_t>(c)] = inner_->channelStats(c);
  const double* r = rate.data_ptr<double>();
  double total = 0;
  for (int c = 0; c < k; ++c) {
    if (r[c] <= 0) return;
    total += r[c];
  }
  double sum = 0;
  for (int c = 0; c < k; ++c) {
    double& w = weights_[static_cast<size_t>(c)];
    w = (1 - opt_.balance_alpha) * w + opt_.balance_alpha * (r[c] / total);
    w = std::max(w, 0.02);  // never starve a channel entirely: keep measuring it
    sum += w;
  }
  for (double& w : weights_) w /= sum;
}

}  // namespace aiacc::comm
