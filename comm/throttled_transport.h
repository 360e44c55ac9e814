// ThrottledTransport: wraps a Transport and slows chosen channels by a fixed number of seconds
// per megabyte, as a congested link or a slower NIC would. For tests and benchmarks of
// speed-weighted channel balancing; everything else passes through unchanged.
//
// Each channel gets its own worker here: an operation runs on the inner transport, is waited
// for, then the channel sleeps bytes * delay. Operations of one channel stay in order.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "aiacc/comm/channel_worker.h"
#include "aiacc/comm/transport.h"

namespace aiacc::comm {

class ThrottledTransport : public Transport {
 public:
  // delay_s_per_mb[c]: extra seconds per MiB on channel c (0: full speed).
  ThrottledTransport(std::shared_ptr<Transport> inner, std::vector<double> delay_s_per_mb);
  ~ThrottledTransport() override;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  int channels() const override { return inner_->channels(); }
  ChannelStats channelStats(int channel) const override;
  std::string describe() const override { return "throttled " + inner_->describe(); }

  std::shared_ptr<Work> allreduce(at::Tensor t, ReduceOp op, int channel) override;
  std::shared_ptr<Work> broadcast(at::Tensor t, int root, int channel) override;
  std::shared_ptr<Work> allgather(at::Tensor in, at::Tensor out, int channel) override;
  std::shared_ptr<Work> reduceScatter(at::Tensor t, int channel) override;
  std::shared_ptr<Work> allgatherShards(at::Tensor t, int channel) override;
  void abort(const std::string& why) override;
  void synchronize() override { inner_->synchronize(); }

 private:
  std::shared_ptr<Work> run(int channel, size_t bytes, std::function<std::shared_ptr<Work>()> op);

  std::shared_ptr<Transport> inner_;
  std::vector<double> delay_;
  std::vector<std::unique_ptr<ChannelWorker>> workers_;  // last: joined before the rest goes
};

}  // namespace aiacc::comm
