// CentralSync: the classic coordinator, kept only so that aiacc_bench negotiation can measure
// what aiacc's decentralized agreement saves. At the end of backward, rank 0 gathers every rank's
// "had a gradient" flags (an allgather stands in for the gather), combines them and broadcasts
// which parameters to reduce; only then does any bucket launch: two dependent round trips per
// step, and no overlap with backward. Parameters that got a gradient on no rank keep an undefined
// .grad. Built from comm's Reducer (launch_in_backward off, given the decision); calls comm/.
#pragma once

#include <memory>

#include "aiacc/comm/buffer_sync.h"
#include "aiacc/comm/gradient_sync.h"
#include "aiacc/comm/reducer.h"
#include "aiacc/comm/transport.h"

namespace aiacc::app {

class CentralSync : public comm::GradientSync {
 public:
  // Broadcasts rank 0's parameters and buffers, like DataParallel (a collective).
  CentralSync(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<comm::Transport> transport,
              const comm::WorldInfo& world);

  const comm::WorldInfo& world() const override { return world_; }
  bool finishBackward() override;
  void allreduceSum(at::Tensor& t) override;
  double exposedCommSeconds() const override { return reducer_->exposedSeconds(); }
  std::string describe() const override { return transport_->describe() + "; central negotiation"; }

 private:
  std::shared_ptr<comm::Transport> transport_;
  comm::WorldInfo world_;
  std::unique_ptr<comm::Reducer> reducer_;
};

}  // namespace aiacc::app
