// StripedTransport: a Transport whose allreduce spreads each buffer across several channels of
// the transport it wraps, in proportion to each channel's measured speed (Horovod and the closed
// accelerator this project measures itself against call this multi-stream communication).
//
//   - allreduce(t): a buffer of at least min_split_bytes is cut into one contiguous piece per
//     active channel, sized by the channel weights (the last piece takes the rounding
//     remainder); a smaller one goes whole to the next channel in round-robin order. The
//     channel argument is ignored. The returned Work waits for every piece; when one fails it
//     aborts the wrapped transport before it waits for the others, then rethrows the first error.
//   - broadcast, allgather, reduceScatter, allgatherShards go unchanged to the wrapped
//     transport's channel.
//   - rebalance(), a collective every rank calls at the same point (DataParallel: after each
//     step), allreduces each channel's bytes/s since the last call over channel 0 and moves the
//     weights toward the measured shares (a moving average: balance_alpha is the newest
//     measurement's weight). Every rank holds the same sums, so every rank splits identically.
//   - setActiveChannels(k) (the tuner) uses the first k of the wrapped transport's channels,
//     with equal weights again.
// Every rank must make the same sequence of calls (as for any transport): the round-robin order
// and the split are then the same everywhere. Calls only the wrapped transport.
#pragma once

#include <memory>
#include <vector>

#include "aiacc/comm/options.h"
#include "aiacc/comm/transport.h"

namespace aiacc::comm {

class StripedTransport : public Transport {
 public:
  StripedTransport(std::shared_ptr<Transport> inner, StripingOptions options = {});

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  int channels() const override { return inner_->channels(); }
  ChannelStats channelStats(int channel) const override { return inner_->channelStats(channel); }
  std::string describe() const override { return inner_->describe(); }
  bool waitsOnDevice() const override { return inner_->waitsOnDevice(); }
  void abort(const std::string& why) override { inner_->abort(why); }
  void synchronize() override { inner_->synchronize(); }

  std::shared_ptr<Work> allreduce(at::Tensor t, ReduceOp op = ReduceOp::kSum, int channel = 0) override;
  std::shared_ptr<Work> broadcast(at::Tensor t, int root, int channel = 0) override {
    return inner_->broadcast(std::move(t), root, channel);
  }
  std::shared_ptr<Work> allgather(at::Tensor in, at::Tensor out, int channel = 0) override {
    return inner_->allgather(std::move(in), std::move(out), channel);
  }
  std::shared_ptr<Work> reduceScatter(at::Tensor t, int channel = 0) override {
    return inner_->reduceScatter(std::move(t), channel);
  }
  std::shared_ptr<Work> allgatherShards(at::Tensor t, int channel = 0) override {
    return inner_->allgatherShards(std::move(t), channel);
  }

  // Collective: see above. A channel that carried nothing since the last call gives no
  // information, and the weights stay.
  void rebalance();
  void setActiveChannels(int k);
  // Shares measured before (a checkpoint's weights()): one positive value per active channel,
  // summing to 1, taken to the bit. On every rank alike, between steps.
  void setWeights(const std::vector<double>& weights);
  int activeChannels() const { return static_cast<int>(weights_.size()); }
  // Share of a split buffer per active channel (sums to 1); the same on every rank.
  const std::vector<double>& weights() const { return weights_; }
  const std::shared_ptr<Transport>& inner() const { return inner_; }

 private:
  std::shared_ptr<Transport> inner_;
  StripingOptions opt_;
  std::vector<double> weights_;           // per active channel
  std::vector<ChannelStats> last_stats_;  // per active channel, at the last rebalance
  size_t next_ = 0;                       // round robin for buffers too small to split
};

}  // namespace aiacc::comm
