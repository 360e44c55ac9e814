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
// The scale and its arithmetic are a comm::GradScale, which the trainer hands to the gradient
// sync (GradientSync::shareLossScale): under fp16 transfer the loss scale is then the transfer's
// scale too, and the sync unscales, checks and moves it, so that the two never compound.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "aiacc/comm/grad_scale.h"
#include "aiacc/comm/gradient_sync.h"

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

// Throws InputError (one line) when this machine cannot run a convolution and its backward
// under autocast in `dtype` on `device` (CPU bf16 needs oneDNN's bf16 kernels, which need
// AVX-512; without them LibTorch fails later with "could not create a primitive descriptor
// iterator"). Runs one tiny convolution.
void requireAutocastWorks(const at::Device& device, at::ScalarType dtype);

// The scale's start, growth, backoff and interval (comm::GradScaleOptions), and whether to scale.
struct GradScalerOptions : comm::GradScaleOptions {
  bool enabled = true;
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
  double scale() const { return scale_->value(); }
  int64_t goodSteps() const { return scale_->goodSteps(); }
  int64_t skippedSteps() const { return scale_->skippedSteps(); }
  // The scale itself, to share with the gradient sync (see above).
  const std::shared_ptr<comm::GradScale>& shared() const { return scale_; }
  // Checkpointed state.
  void setState(double scale, int64_t good_steps) { scale_->setState(scale, good_steps); }

 private:
  GradScalerOptions opt_;
  std::shared_ptr<comm::GradScale> scale_;
};

// The end of one training step, after backward: the gradient sync, the loss scaler's unscale,
// overflow check and scale update, and the optimizer step. The one place where a step is decided
// (the trainer calls it; so do the tests of the scaler's protocol).
//   - `sync_unscales` (GradientSync::shareLossScale returned true: fp16 transfer under AMP fp16):
//     the sync unscales, checks and moves the one scale itself; nothing is done here but the step;
//   - otherwise, with the scaler enabled: a step the sync stands is unscaled and checked here; a
//     step the sync refuses (its reduced-precision wire was not finite, e.g. bf16 transfer of
//     overflowed fp16-scaled gradients) is an overflow of the scaled gradients, so the scale backs
//     off exactly as if the check here had found it (else the scale would never move and every
//     later overflowing step would be skipped);
//   - the scaler disabled (fp32, bf16 autocast): the sync's verdict alone.
// Returns whether `optimizer_step` ran. Every rank sees the same reduced gradients, so every
// rank returns the same.
bool finishStep(comm::GradientSync& sync, GradScaler& scaler, bool sync_unscales, const std::vector<at::Tensor>& params,
                const std::function<void()>& optimizer_step);

}  // namespace aiacc::app
