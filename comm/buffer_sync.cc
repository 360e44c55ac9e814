#include "aiacc/comm/buffer_sync.h"

#include <torch/torch.h>

#include <functional>
#include <map>

namespace aiacc::comm {
namespace {

// Flattens tensors of one dtype into one buffer, lets op transform it, copies the result back:
// one collective instead of one per tensor.
void coalesced(const std::vector<at::Tensor>& list, const std::function<void(at::Tensor&)>& op) {
  if (list.empty()) return;
  std::vector<at::Tensor> flat;
  for (const auto& t : list) flat.push_back(t.reshape(-1));
  at::Tensor buf = at::cat(flat);
  op(buf);
  int64_t off = 0;
  for (auto t : list) {
    t.copy_(buf.narrow(0, off, t.numel()).view_as(t));
    off += t.numel();
  }
}

}  // namespace

void broadcastModuleState(torch::nn::Module& module, Transport& transport, bool parameters, bool buffers) {
  at::NoGradGuard no_grad;
  std::map<at::ScalarType, std::vector<at::Tensor>> by_type;
  if (parameters) {
    for (const auto& p : module.parameters()) by_type[p.scalar_type()].push_back(p);
  }
  if (buffers) {
    for (const auto& b : module.buffers()) by_type[b.scalar_type()].push_back(b);
  }
  for (auto& [type, list] : by_type) {
    coalesced(list, [&](at::Tensor& buf) { transport.broadcast(buf, 0, 0)->wait(); });
  }
}

void BufferPolicy::beforeForward(Transport& transport) {
  if (world_ == 1) return;
  if (mode_ == BufferSync::kBroadcast) broadcastModuleState(*module_, transport, false, true);
  if (mode_ == BufferSync::kAverage) average(transport);
  dirty_ = true;
}

void BufferPolicy::beforeRead(Transport& transport) {
  if (world_ == 1 || !dirty_) return;
  if (mode_ == BufferSync::kBroadcast) broadcastModuleState(*module_, transport, false, true);
  if (mode_ == BufferSync::kAverage || mode_ == BufferSync::kAverageWhenRead) average(transport);
  dirty_ = false;
}

// Floating-point buffers (running mean/var) are averaged; integer ones (num_batches_tracked)
// are identical on every rank already.
void BufferPolicy::average(Transport& transport) {
  at::NoGradGuard no_grad;
  std::map<at::ScalarType, std::vector<at::Tensor>> by_type;
  for (const auto& b : module_->buffers()) {
    if (b.is_floating_point()) by_type[b.scalar_type()].push_back(b);
  }
  for (auto& [type, list] : by_type) {
    coalesced(list, [&](at::Tensor& buf) {
      transport.allreduce(buf, ReduceOp::kSum, 0)->wait();
      buf.div_(world_);
    });
  }
}

}  // namespace aiacc::comm
