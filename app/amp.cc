#include "app/amp.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include <map>

#include "aiacc/common/error.h"
#include "aiacc/common/torch_compat.h"

namespace aiacc::app {

AutocastGuard::AutocastGuard(bool enabled, at::DeviceType device_type, at::ScalarType dtype)
    : enabled_(enabled), device_type_(device_type) {
  if (!enabled_) return;
  AIACC_CHECK(device_type == at::kCUDA || device_type == at::kCPU, "autocast: CPU or CUDA only");
  AIACC_CHECK(dtype == at::kHalf || dtype == at::kBFloat16, "autocast: fp16 or bf16 only");
  prev_enabled_ = compat::autocastEnabled(device_type);
  prev_dtype_ = compat::autocastDtype(device_type);
  compat::setAutocastEnabled(device_type, true);
  compat::setAutocastDtype(device_type, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
  // Leaving the outermost scope drops the fp16 copies of the weights cast inside it: the next
  // step's weights are different tensors' values.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::setAutocastEnabled(device_type_, prev_enabled_);
  compat::setAutocastDtype(device_type_, prev_dtype_);
}

void requireAutocastWorks(const at::Device& device, at::ScalarType dtype) {
  try {
    const at::Tensor x = at::ones({1, 4, 4, 4}, at::TensorOptions().device(device));
    const at::Tensor w = at::ones({4, 4, 3, 3}, at::TensorOptions().device(device)).requires_grad_();
    at::Tensor y;
    {
      AutocastGuard autocast(true, device.type(), dtype);
      y = at::conv2d(x, w, {}, 1, 1);
    }
    y.to(at::kFloat).sum().backward();
  } catch (const std::exception& e) {  // c10::Error, or oneDNN's own dnnl::error from ideep
    AIACC_THROW(InputError, "--amp: this machine cannot compute a convolution in ",
                dtype == at::kHalf ? "fp16" : "bf16", " on ", device.str(),
                device.is_cpu() ? " (oneDNN's bf16 kernels need a CPU with AVX-512)" : "", ": ", firstLine(e.what()),
                "; run without --amp");
  }
}

// comm::GradScale validates the options (one line naming the option).
GradScaler::GradScaler(GradScalerOptions options) : opt_(options), scale_(std::make_shared<comm::GradScale>(options)) {}

at::Tensor GradScaler::scaleLoss(const at::Tensor& loss) const { return opt_.enabled ? loss * scale_->value() : loss; }

bool GradScaler::unscaleAndCheck(const std::vector<at::Tensor>& params) {
  if (!opt_.enabled) return true;
  const double inv = 1.0 / scale_->value();
  std::map<at::ScalarType, std::vector<at::Tensor>> cuda_grads;  // the fused kernel takes one dtype
  std::vector<at::Tensor> flags;
  for (const at::Tensor& p : params) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    if (g.is_cuda()) {
      cuda_grads[g.scalar_type()].push_back(g);
    } else {
      g.mul_(inv);
      flags.push_back(at::isfinite(g).all());
    }
  }
  for (auto& [dtype, grads] : cuda_grads) {
    // found_inf and inv_scale live on the gradients' device (one per process), so nothing waits
    // for the host until the one read below.
    const auto opts = grads.front().options().dtype(at::kFloat);
    at::Tensor found_inf = at::zeros({1}, opts);
    at::Tensor inv_scale = at::full({1}, inv, opts);
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
    flags.push_back(found_inf.eq(0).all().cpu());
  }
  if (flags.empty()) return true;
  return at::stack(flags).all().item<bool>();
}

void GradScaler::update(bool found_inf) {
  if (opt_.enabled) scale_->update(!found_inf);
}

bool finishStep(comm::GradientSync& sync, GradScaler& scaler, bool sync_unscales, const std::vector<at::Tensor>& params,
                const std::function<void()>& optimizer_step) {
  bool ok = sync.finishBackward();
  if (scaler.enabled() && !sync_unscales) {
    if (ok) {
      sync.synchronize();  // the host reads the reduced gradients next: a failed reduction raises here
      ok = scaler.unscaleAndCheck(params);
      scaler.update(/*found_inf=*/!ok);
    } else {
      scaler.update(/*found_inf=*/true);
    }
  }
  if (ok) optimizer_step();
  return ok;
}

}  // namespace aiacc::app
