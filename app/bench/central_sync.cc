#include "app/bench/central_sync.h"

#include <ATen/ATen.h>

namespace aiacc::app {

CentralSync::CentralSync(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<comm::Transport> transport,
                         const comm::WorldInfo& world)
    : transport_(std::move(transport)), world_(world) {
  comm::ReducerOptions o;
  o.launch_in_backward = false;
  reducer_ = std::make_unique<comm::Reducer>(module, transport_, transport_, comm::makeCodec({}), world_, o);
  comm::broadcastModuleState(*module, *transport_, /*parameters=*/true, /*buffers=*/true);
}

bool CentralSync::finishBackward() {
  const at::Tensor mine = reducer_->localGradientFlags();
  at::Tensor all = at::empty({world_.world, mine.numel()}, at::kByte);
  transport_->allgather(mine, all, 0)->wait();
  at::Tensor decision = world_.rank == 0 ? std::get<0>(all.max(0)).contiguous() : at::empty({mine.numel()}, at::kByte);
  transport_->broadcast(decision, 0, 0)->wait();
  return reducer_->finish(decision);
}

void CentralSync::allreduceSum(at::Tensor& t) {
  at::Tensor c = t.contiguous();
  transport_->allreduce(c, comm::ReduceOp::kSum, 0)->wait();
  if (!c.is_same(t)) t.copy_(c);
}

}  // namespace aiacc::app
