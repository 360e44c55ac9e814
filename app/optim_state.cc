#include "app/optim_state.h"

#include <map>
#include <string>

#include "aiacc/common/error.h"
#include "aiacc/common/torch_compat.h"
#include "models/torch_values.h"

namespace aiacc::app {
namespace {

using torch::optim::SGDOptions;
using torch::optim::SGDParamState;

std::string groupKey(size_t g, const char* what) { return strCat("group/", g, "/", what); }

int64_t readInt(torch::serialize::InputArchive& in, const std::string& key) {
  c10::IValue v;
  in.read(key, v);
  return v.toInt();
}

double readDouble(torch::serialize::InputArchive& in, const std::string& key) {
  c10::IValue v;
  in.read(key, v);
  return v.toDouble();
}

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

void writeSgdState(const torch::optim::SGD& sgd, torch::serialize::OutputArchive& out) {
  const auto& groups = sgd.param_groups();
  const auto& state = sgd.state();
  out.write("groups", c10::IValue(static_cast<int64_t>(groups.size())));
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& o = static_cast<const SGDOptions&>(groups[g].options());
    const auto& params = groups[g].params();
    out.write(groupKey(g, "size"), c10::IValue(static_cast<int64_t>(params.size())));
    out.write(groupKey(g, "lr"), c10::IValue(o.lr()));
    out.write(groupKey(g, "momentum"), c10::IValue(o.momentum()));
    out.write(groupKey(g, "dampening"), c10::IValue(o.dampening()));
    out.write(groupKey(g, "weight_decay"), c10::IValue(o.weight_decay()));
    out.write(groupKey(g, "nesterov"), c10::IValue(o.nesterov()));
    for (size_t j = 0; j < params.size(); ++j) {
      const auto it = state.find(compat::optimStateKey(params[j]));
      if (it == state.end()) continue;
      const at::Tensor& buf = static_cast<const SGDParamState&>(*it->second).momentum_buffer();
      if (buf.defined()) out.write(strCat("momentum/", g, "/", j), buf.detach().cpu(), /*is_buffer=*/true);
    }
  }
}

void readSgdState(torch::optim::SGD& sgd, torch::serialize::InputArchive& in) {
  auto& groups = sgd.param_groups();
  const int64_t n_groups = readInt(in, "groups");
  AIACC_CHECK_IO(n_groups == static_cast<int64_t>(groups.size()), "the optimizer state has ", n_groups,
                 " parameter groups, the optimizer ", groups.size());
  sgd.state().clear();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    const int64_t n = readInt(in, groupKey(g, "size"));
    AIACC_CHECK_IO(n == static_cast<int64_t>(params.size()), "parameter group ", g, " has ", n,
                   " parameters in the checkpoint, ", params.size(), " in the optimizer");
    auto& o = static_cast<SGDOptions&>(groups[g].options());
    o.lr(readDouble(in, groupKey(g, "lr")));
    o.momentum(readDouble(in, groupKey(g, "momentum")));
    o.dampening(readDouble(in, groupKey(g, "dampening")));
    o.weight_decay(readDouble(in, groupKey(g, "weight_decay")));
    c10::IValue v;
    in.read(groupKey(g, "nesterov"), v);
    o.nesterov(v.toBool());
    for (size_t j = 0; j < params.size(); ++j) {
      at::Tensor buf;
      if (in.try_read(strCat("momentum/", g, "/", j), buf, /*is_buffer=*/true)) setMomentum(sgd, params[j], buf);
    }
  }
}

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

void readLegacySgdState(torch::optim::SGD& sgd, torch::serialize::InputArchive& in) {
  // torch::optim::serialize's layout: "state"/<key>/momentum_buffer and
  // "param_groups"/"param_groups/<i>"/{"params/size", "params/<j>" (the key), "options"/...}.
  torch::serialize::InputArchive state_ar, groups_ar;
  in.read("state", state_ar);
  in.read("param_groups", groups_ar);
  std::map<std::string, at::Tensor> buffers;
  for (const std::string& key : state_ar.keys()) {
    torch::serialize::InputArchive one;
    at::Tensor buf;
    if (state_ar.try_read(key, one) && one.try_read("momentum_buffer", buf, /*is_buffer=*/true)) {
      buffers[key] = buf;
    }
  }
  at::Tensor size_t_;
  groups_ar.read("param_groups/size", size_t_);
  auto& groups = sgd.param_groups();
  const int64_t n_groups = size_t_.item<int64_t>();
  AIACC_CHECK_IO(n_groups == static_cast<int64_t>(groups.size()), "the optimizer state has ", n_groups,
                 " parameter groups, the optimizer ", groups.size());
  sgd.state().clear();
  for (size_t g = 0; g < groups.size(); ++g) {
    torch::serialize::InputArchive group_ar, options_ar;
    groups_ar.read(strCat("param_groups/", g), group_ar);
    at::Tensor n_t;
    group_ar.read("params/size", n_t);
    const auto& params = groups[g].params();
    AIACC_CHECK_IO(n_t.item<int64_t>() == static_cast<int64_t>(params.size()), "parameter group ", g, " has ",
                   n_t.item<int64_t>(), " parameters in the checkpoint, ", params.size(), " in the optimizer");
    group_ar.read("options", options_ar);
    auto& o = static_cast<SGDOptions&>(groups[g].options());
    c10::IValue v;
    if (options_ar.try_read("lr", v)) o.lr(v.toDouble());
    if (options_ar.try_read("momentum", v)) o.momentum(v.toDouble());
    if (options_ar.try_read("dampening", v)) o.dampening(v.toDouble());
    if (options_ar.try_read("weight_decay", v)) o.weight_decay(v.toDouble());
    if (options_ar.try_read("nesterov", v)) o.nesterov(v.toBool());
    for (size_t j = 0; j < params.size(); ++j) {
      group_ar.read(strCat("params/", j), v);
      const auto it = buffers.find(v.toStringRef());
      if (it != buffers.end()) setMomentum(sgd, params[j], it->second);
    }
  }
}

}  // namespace aiacc::app
