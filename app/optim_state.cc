#include "app/optim_state.h"

#include <string>

#include "aiacc/common/error.h"
#include "aiacc/common/torch_compat.h"
#include "models/torch_values.h"

namespace aiacc::app {
namespace {

using torch::optim::SGDOptions;
using torch::optim::SGDParamState;

void setMomentum(torch::optim::SGD& sgd, const at::Tensor& p, const at::Tensor& buffer) {
  AIACC_CHECK_IO(buffer.sizes() == p.sizes(), "a momentum buffer of shape ", buffer.sizes(),
                 " for a parameter of shape ", p.sizes());
  auto st = std::make_unique<SGDParamState>();
  st->momentum_buffer(buffer.to(p.device(), p.scalar_type()).contiguous());
  sgd.state()[compat::optimStateKey(p)] = std::move(st);
}

// p's momentum buffer in sgd's state (undefined: none yet).
at::Tensor momentumBuffer(const torch::optim::SGD& sgd, const at::Tensor& p) {
  const auto it = sgd.state().find(compat::optimStateKey(p));
  return it == sgd.state().end() ? at::Tensor() : static_cast<const SGDParamState&>(*it->second).momentum_buffer();
}

}  // namespace

c10::IValue sgdStateValue(const torch::optim::SGD& sgd) {
  c10::impl::GenericList groups = models::plainList();
  for (const auto& group : sgd.param_groups()) {
    const auto& o = static_cast<const SGDOptions&>(group.options());
    c10::impl::GenericDict g = models::plainDict();
    g.insert("lr", models::real(o.lr()));
    g.insert("momentum", models::real(o.momentum()));
    g.insert("dampening", models::real(o.dampening()));
    g.insert("weight_decay", models::real(o.weight_decay()));
    g.insert("nesterov", o.nesterov());
    c10::impl::GenericList buffers = models::plainList();
    for (const auto& p : group.params()) {
      const at::Tensor buf = momentumBuffer(sgd, p);
      buffers.push_back(buf.defined() ? c10::IValue(buf.detach().cpu()) : c10::IValue());
    }
    g.insert("momentum_buffers", buffers);
    groups.push_back(g);
  }
  c10::impl::GenericDict out = models::plainDict();
  out.insert("groups", groups);
  return out;
}

std::vector<at::Tensor> momentumBuffers(const torch::optim::SGD& sgd) {
  std::vector<at::Tensor> out;
  for (const auto& group : sgd.param_groups()) {
    for (const auto& p : group.params()) out.push_back(momentumBuffer(sgd, p));
  }
  return out;
}

void restoreSgdState(torch::optim::SGD& sgd, const c10::IValue& value) {
  const c10::List<c10::IValue> saved = models::listOf(models::field(models::dictOf(value, "optimizer"), "groups",
                                                                    "optimizer"),
                                                      "optimizer groups");
  auto& groups = sgd.param_groups();
  AIACC_CHECK_IO(saved.size() == groups.size(), "the optimizer state has ", saved.size(),
                 " parameter groups, the optimizer ", groups.size());
  sgd.state().clear();
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string where = strCat("parameter group ", g);
    const c10::impl::GenericDict d = models::dictOf(saved.get(g), where);
    const c10::List<c10::IValue> buffers = models::listOf(models::field(d, "momentum_buffers", where), where);
    const auto& params = groups[g].params();
    AIACC_CHECK_IO(buffers.size() == params.size(), where, " has ", buffers.size(), " parameters in the checkpoint, ",
                   params.size(), " in the optimizer");
    auto& o = static_cast<SGDOptions&>(groups[g].options());
    o.lr(models::realOf(models::field(d, "lr", where), where + " lr"));
    o.momentum(models::realOf(models::field(d, "momentum", where), where + " momentum"));
    o.dampening(models::realOf(models::field(d, "dampening", where), where + " dampening"));
    o.weight_decay(models::realOf(models::field(d, "weight_decay", where), where + " weight_decay"));
    o.nesterov(models::boolOf(models::field(d, "nesterov", where), where + " nesterov"));
    for (size_t j = 0; j < params.size(); ++j) {
      const c10::IValue b = buffers.get(j);
      if (b.isNone()) continue;
      AIACC_CHECK_IO(b.isTensor(), where, " momentum buffer ", j, " is a ", b.tagKind());
      setMomentum(sgd, params[j], b.toTensor());
    }
  }
}

}  // namespace aiacc::app
