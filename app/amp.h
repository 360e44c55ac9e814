// Mixed precision for the training loop: an autocast scope and a dynamic loss scaler.
//
// LibTorch has autocast (the dispatcher casts conv/matmul inputs to fp16 or bf16 inside the
// scope) but no GradScaler; this is one, with PyTorch's semantics:
//   - the loss is multiplied by `scale` before backward, so small fp16 gradients do not flush to 0;
//   - after backward (and after DataParallel has averaged the scaled gradients, so every rank
//     sees the same values), the gradients are divided by `scale` in place and checked: any
//     inf/NaN skips the optimizer step on every rank alike and multiplies scale by `backoff`;
//   - after `growth_interval` finite steps in a row, scale is multiplied by `growth`.
// Master weights stay fp32 (autocast casts per op; parameters are never converted). bf16 has
// fp32's range and needs no scaling: the scaler is then disabled and costs nothing.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace aiacc::app {

// Autocast on `device_type` for the guard's lifetime, in `dtype` (kHalf or kBFloat16); a no-op
// when !enabled. Restores the previous state and clears the cast-weight cache on exit.
class AutocastGuard {
 public:
  AutocastGuard(bool enabled, at::DeviceType device_type, at::ScalarType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool enabled_;
  at::DeviceType device_type_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kFloat;
};

struct GradScalerOptions {
  bool enabled = true;
  double init_scale = 65536.0;  // 2^16, as PyTorch's
  double growth = 2.0;
  double backoff = 0.5;
  int64_t growth_interval = 2000;
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  // loss * scale (the loss itself when disabled).
  at::Tensor scaleLoss(const at::Tensor& loss) const;
  // Divides every defined gradient of `params` by the scale, in place, and returns whether all
  // of them are finite. CUDA gradients take PyTorch's fused kernel (one launch per dtype and
  // device); others a per-tensor loop. One host read of the flag per call.
  bool unscaleAndCheck(const std::vector<at::Tensor>& params);
  // Adjusts the scale after a step: backoff on overflow, growth after an interval of good steps.
  void update(bool found_inf);

  bool enabled() const { return opt_.enabled; }
  double scale() const { return scale_; }
  int64_t goodSteps() const { return good_steps_; }
  int64_t skippedSteps() const { return skipped_; }
  // Checkpointed state.
  void setState(double scale, int64_t good_steps) {
    scale_ = scale;
    good_steps_ = good_steps;
  }

 private:
  GradScalerOptions opt_;
  double scale_;
  int64_t good_steps_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace aiacc::app
