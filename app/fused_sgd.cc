#include "app/fused_sgd.h"

#include <immintrin.h>

#include <cmath>
#include <optional>
#include <string>
#include <type_traits>

#include "aiacc/common/torch_compat.h"

namespace aiacc::app {
namespace {

// One SGD step on n elements, in the order of torch::optim::SGD::step:
//   d = g + wd * w                      (d_p.add(p, wd); skipped when wd == 0)
//   b = first ? d : b * m + (1 - damp) * d   (buf.mul_(m).add_(d_p, 1 - damp))
//   u = nesterov ? d + m * b : b        (d_p.add(buf, m))
//   w = w - lr * u                      (p.add_(d_p, -lr))
// ATen's vectorized add-with-alpha is a fused multiply-add; so is each step here.
struct Step {
  float lr, momentum, damp1, wd;
  bool nesterov, first;
};

__attribute__((target("avx2,fma"))) void sgdKernel(float* w, const float* g, float* b, size_t n, const Step& s) {
  const __m256 vlr = _mm256_set1_ps(-s.lr), vm = _mm256_set1_ps(s.momentum), vd = _mm256_set1_ps(s.damp1),
               vwd = _mm256_set1_ps(s.wd);
  const bool decay = s.wd != 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 wi = _mm256_loadu_ps(w + i);
    __m256 d = _mm256_loadu_ps(g + i);
    if (decay) d = _mm256_fmadd_ps(wi, vwd, d);
    __m256 bi;
    if (s.first) {
      bi = d;
    } else {
      bi = _mm256_mul_ps(_mm256_loadu_ps(b + i), vm);
      bi = s.damp1 == 1.0f ? _mm256_add_ps(bi, d) : _mm256_fmadd_ps(d, vd, bi);
    }
    _mm256_storeu_ps(b + i, bi);
    const __m256 u = s.nesterov ? _mm256_fmadd_ps(bi, vm, d) : bi;
    _mm256_storeu_ps(w + i, _mm256_fmadd_ps(u, vlr, wi));
  }
  for (; i < n; ++i) {
    float d = g[i];
    if (decay) d = std::fma(s.wd, w[i], d);
    float bi = s.first ? d : (s.damp1 == 1.0f ? b[i] * s.momentum + d : std::fma(s.damp1, d, b[i] * s.momentum));
    b[i] = bi;
    const float u = s.nesterov ? std::fma(s.momentum, bi, d) : bi;
    w[i] = std::fma(-s.lr, u, w[i]);
  }
}

// Without momentum there is no buffer: w = w - lr * (g + wd * w).
__attribute__((target("avx2,fma"))) void sgdPlainKernel(float* w, const float* g, size_t n, float lr, float wd) {
  const __m256 vlr = _mm256_set1_ps(-lr), vwd = _mm256_set1_ps(wd);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 wi = _mm256_loadu_ps(w + i);
    __m256 d = _mm256_loadu_ps(g + i);
    if (wd != 0) d = _mm256_fmadd_ps(wi, vwd, d);
    _mm256_storeu_ps(w + i, _mm256_fmadd_ps(d, vlr, wi));
  }
  for (; i < n; ++i) {
    const float d = wd != 0 ? std::fma(wd, w[i], g[i]) : g[i];
    w[i] = std::fma(-lr, d, w[i]);
  }
}

bool dense(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous() &&
         t.layout() == at::kStrided;
}

// Every parameter with a gradient, and its gradient, on one CUDA device, strided, with one dtype: what the _foreach_
// kernels take in one launch per chunk.
bool oneCudaDevice(torch::optim::SGD& opt) {
  std::optional<at::Device> device;
  std::optional<at::ScalarType> dtype;
  auto same = [&](const at::Tensor& t) {
    if (!t.is_cuda() || t.layout() != at::kStrided) return false;
    if (!device) device = t.device(), dtype = t.scalar_type();
    return t.device() == *device && t.scalar_type() == *dtype;
  };
  bool any = false;
  for (auto& group : opt.param_groups()) {
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (!same(p) || !same(p.grad())) return false;
      any = true;
    }
  }
  return any;
}

}  // namespace

void multiTensorSgdStep(torch::optim::SGD& opt) {
  torch::NoGradGuard no_grad;
  auto& states = opt.state();
  for (auto& group : opt.param_groups()) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    std::vector<at::Tensor> params, grads;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      params.push_back(p);
      grads.push_back(p.grad());
    }
    if (params.empty()) continue;
    // d = g + wd * w (out of place, as SGD's d_p.add(p, wd))
    std::vector<at::Tensor> d = o.weight_decay() != 0 ? at::_foreach_add(grads, params, o.weight_decay()) : grads;
    if (o.momentum() != 0) {
      // Buffers made this step start as d (SGD's clone of d_p); the others are updated. Each
      // parameter's state is looked up once (in 1.13 its key is a formatted string).
      std::vector<at::Tensor> bufs, d_old, all_bufs;
      all_bufs.reserve(params.size());
      for (size_t i = 0; i < params.size(); ++i) {
        const auto key = compat::optimStateKey(params[i]);
        auto it = states.find(key);
        if (it == states.end()) {
          auto st = std::make_unique<torch::optim::SGDParamState>();
          st->momentum_buffer(d[i].clone().detach());
          all_bufs.push_back(st->momentum_buffer());
          states[key] = std::move(st);
          continue;
        }
        bufs.push_back(static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer());
        all_bufs.push_back(bufs.back());
        d_old.push_back(d[i]);
      }
      if (!bufs.empty()) {  // b = b * m + (1 - damp) * d
        at::_foreach_mul_(bufs, o.momentum());
        at::_foreach_add_(bufs, d_old, 1 - o.dampening());
      }
      // u = nesterov ? d + m * b : b
      d = o.nesterov() ? at::_foreach_add(d, all_bufs, o.momentum()) : all_bufs;
    }
    at::_foreach_add_(params, d, -o.lr());  // w = w - lr * u
  }
}

torch::Tensor FusedSgd::step(LossClosure closure) {
  if (oneCudaDevice(*this)) {
    torch::Tensor loss;
    if (closure != nullptr) {
      at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    multiTensorSgdStep(*this);
    ++multi_tensor_steps_;
    return loss;
  }
  static const bool have_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  bool fusable = have_fma;
  auto& states = state();
  for (auto& group : param_groups()) {
    for (auto& p : group.params()) {
      if (!fusable || !p.grad().defined()) continue;
      fusable = dense(p) && dense(p.grad());
      const auto it = states.find(compat::optimStateKey(p));
      if (fusable && it != states.end()) {
        fusable = dense(static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer());
      }
    }
  }
  if (!fusable) return torch::optim::SGD::step(std::move(closure));

  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    Step s{static_cast<float>(o.lr()),
           static_cast<float>(o.momentum()),
           static_cast<float>(1 - o.dampening()),
           static_cast<float>(o.weight_decay()),
           o.nesterov(),
           false};
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      float* w = p.data_ptr<float>();
      const float* g = p.grad().data_ptr<float>();
      const auto n = static_cast<size_t>(p.numel());
      if (o.momentum() == 0) {
        sgdPlainKernel(w, g, n, s.lr, s.wd);
        continue;
      }
      const auto key = compat::optimStateKey(p);
      auto it = states.find(key);
      s.first = it == states.end();
      if (s.first) {  // SGD's first step: the buffer starts as this step's d_p
        auto st = std::make_unique<torch::optim::SGDParamState>();
        st->momentum_buffer(at::empty_like(p, at::MemoryFormat::Contiguous));
        states[key] = std::move(st);
        it = states.find(key);
      }
      at::Tensor buf = static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer();
      sgdKernel(w, g, buf.data_ptr<float>(), n, s);
    }
  }
  ++fused_steps_;
  return loss;
}

}  // namespace aiacc::app
